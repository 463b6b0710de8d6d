//! Attaching to a TUN device that lives in another network namespace, and the raw reads and
//! writes the relay does on it.
//!
//! `TUNSETIFF` looks the device up in the calling thread's namespace, and `setns` changes only
//! the calling thread's, so the attach happens on a short-lived thread that enters the namespace
//! first; the file descriptor keeps working from any thread afterwards.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::Error;

// linux/if_tun.h
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An attached TUN device: one read end and one write end of a namespace's interface.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
}

impl Tun {
    /// Attach to `dev` in the namespace `ns` (by its name under /var/run/netns), non-blocking.
    pub fn open_in(ns: &str, dev: &str) -> Result<Tun, Error> {
        let ns_path = format!("/var/run/netns/{ns}");
        let dev = dev.to_string();
        std::thread::spawn(move || -> Result<Tun, Error> {
            let ns_file = File::open(&ns_path)
                .map_err(|e| Error::Setup(format!("cannot open {ns_path}: {e}")))?;
            // SAFETY: setns on a valid namespace fd affects only this (short-lived) thread.
            if unsafe { libc::setns(ns_file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(Error::Setup(format!(
                    "cannot enter namespace {ns_path}: {}",
                    io::Error::last_os_error()
                )));
            }
            attach(&dev)
        })
        .join()
        .map_err(|_| Error::Setup("the TUN attach thread panicked".into()))?
    }

    /// The descriptor, for polling.
    pub fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    /// Read one packet; `Ok(None)` when none is waiting.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: buf is valid for writes of buf.len() bytes.
        let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        }
    }

    /// Write one packet into the namespace's stack.
    pub fn write(&self, packet: &[u8]) -> io::Result<()> {
        // SAFETY: packet is valid for reads of packet.len() bytes.
        let n = unsafe { libc::write(self.raw(), packet.as_ptr().cast(), packet.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn attach(dev: &str) -> Result<Tun, Error> {
    let path = c"/dev/net/tun";
    // SAFETY: a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(Error::Setup(format!(
            "cannot open /dev/net/tun: {e} (is the tun module loaded? try 'modprobe tun')"
        )));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    if dev.len() >= libc::IFNAMSIZ {
        return Err(Error::Setup(format!("device name '{dev}' is too long")));
    }
    req.name[..dev.len()].copy_from_slice(dev.as_bytes());
    // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is laid out as.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req) } < 0 {
        return Err(Error::Setup(format!(
            "cannot attach to TUN device {dev}: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(Tun { fd })
}
