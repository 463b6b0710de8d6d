//! The two network namespaces of a run and their TUN devices, made with iproute2 and removed
//! when the [`Namespaces`] value is dropped (normal exit, error, Ctrl-C and SIGTERM all end in
//! that drop).
//!
//! Path N is the TUN pair `pN`: 10.77.N.1 inside, 10.77.N.2 outside, point-to-point. Policy
//! routing inside sends every packet with source 10.77.N.1 out of `pN`, so a multi-homed program
//! that binds to a path's address uses that path whatever the destination (as a phone with
//! Wi-Fi and cellular does); the inside default route is path 1. IPv4 only: IPv6 is off in both
//! namespaces (it would only add router solicitations to the links).
//!
//! Each namespace gets its own /etc/hosts (`ip netns exec` mounts /etc/netns/NAME/hosts over
//! it): `qgate.test` and `linkem-peer` name path 1's far end, `linkem-peer-N` path N's, so
//! qgate's development certificate (valid for `qgate.test`) verifies across the emulation.

use std::net::Ipv4Addr;
use std::process::Command;

use crate::Error;

/// The address of path `path` (from 1) inside (`side = 1`) or outside (`side = 2`).
pub fn address(path: usize, side: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, path as u8, side)
}

/// The TUN device name of a path.
pub fn device(path: usize) -> String {
    format!("p{path}")
}

/// The namespaces of one run (named after this process), removed on drop.
#[derive(Debug)]
pub struct Namespaces {
    /// Where COMMAND runs.
    pub inside: String,
    /// Where the outside command runs.
    pub outside: String,
    created: Vec<String>,
}

/// The prefix of every namespace linkem makes (`qgate-le-PID-in`, `qgate-le-PID-out`).
pub const PREFIX: &str = "qgate-le-";

fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::Setup(format!("cannot run 'ip' (iproute2): {e}")))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "'ip {}' failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Run a shell snippet inside a namespace (sysctl writes).
fn in_ns(ns: &str, script: &str) -> Result<(), Error> {
    ip(&["netns", "exec", ns, "sh", "-c", script])
}

impl Namespaces {
    /// Make both namespaces and `paths` TUN pairs, addressed and routed; TUN queues are
    /// lengthened (the default 500 silently drops bursts: ../shared/references/linkem.md).
    pub fn create(paths: usize) -> Result<Namespaces, Error> {
        remove_stale();
        let pid = std::process::id();
        let mut ns = Namespaces {
            inside: format!("{PREFIX}{pid}-in"),
            outside: format!("{PREFIX}{pid}-out"),
            created: Vec::new(),
        };
        for (name, peer_side) in [(ns.inside.clone(), 2), (ns.outside.clone(), 1)] {
            ip(&["netns", "add", &name])?;
            ns.created.push(name.clone());
            write_hosts(&name, paths, peer_side)?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            // Asymmetric routes (a path's packets answered on another) are the point of
            // multi-homing; reverse-path filtering would drop them.
            in_ns(
                &name,
                "echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter; \
                 echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter; \
                 echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; \
                 echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6",
            )?;
        }
        for path in 1..=paths {
            let dev = device(path);
            for (name, me, peer) in [(&ns.inside, 1, 2), (&ns.outside, 2, 1)] {
                let (me, peer) = (address(path, me), address(path, peer));
                ip(&["-n", name, "tuntap", "add", "dev", &dev, "mode", "tun"])?;
                ip(&[
                    "-n",
                    name,
                    "addr",
                    "add",
                    &format!("{me}/32"),
                    "peer",
                    &format!("{peer}/32"),
                    "dev",
                    &dev,
                ])?;
                ip(&["-n", name, "link", "set", &dev, "txqueuelen", "4096", "up"])?;
            }
            let table = (100 + path).to_string();
            let src = address(path, 1).to_string();
            ip(&[
                "-n", &ns.inside, "rule", "add", "from", &src, "table", &table,
            ])?;
            ip(&[
                "-n", &ns.inside, "route", "add", "default", "dev", &dev, "table", &table,
            ])?;
        }
        ip(&[
            "-n",
            &ns.inside,
            "route",
            "add",
            "default",
            "dev",
            &device(1),
        ])?;
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in self.created.drain(..) {
            remove(&name);
        }
    }
}

/// The /etc/hosts a namespace sees: the far end of each path by name.
fn write_hosts(name: &str, paths: usize, peer_side: u8) -> Result<(), Error> {
    let dir = std::path::Path::new("/etc/netns").join(name);
    let mut hosts = String::from("127.0.0.1 localhost\n");
    hosts.push_str(&format!(
        "{} qgate.test linkem-peer\n",
        address(1, peer_side)
    ));
    for path in 1..=paths {
        hosts.push_str(&format!(
            "{} linkem-peer-{path}\n",
            address(path, peer_side)
        ));
    }
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("hosts"), hosts))
        .map_err(|e| Error::Setup(format!("cannot write {}: {e}", dir.display())))
}

/// The processes still inside a namespace (they keep it, and its devices, alive).
fn pids(name: &str) -> Vec<libc::pid_t> {
    Command::new("ip")
        .args(["netns", "pids", name])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// End every process left in a namespace (SIGTERM, then SIGKILL after a second), then delete
/// it and its hosts file: a background job of COMMAND would otherwise keep the namespace and
/// its TUN devices alive, invisible to `ip netns list`.
fn remove(name: &str) {
    for (sig, wait) in [(libc::SIGTERM, 1000), (libc::SIGKILL, 500)] {
        let left = pids(name);
        if left.is_empty() {
            break;
        }
        for pid in &left {
            // SAFETY: signalling processes inside our own namespace.
            unsafe { libc::kill(*pid, sig) };
        }
        let until = std::time::Instant::now() + std::time::Duration::from_millis(wait);
        while std::time::Instant::now() < until && !pids(name).is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    if let Err(e) = ip(&["netns", "del", name]) {
        eprintln!("linkem: could not remove namespace {name}: {e}");
    }
    let _ = std::fs::remove_dir_all(std::path::Path::new("/etc/netns").join(name));
}

/// Remove namespaces left by a linkem that was killed (SIGKILL cannot be caught): those named
/// after a process that no longer exists.
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        // Our own PID's are stale too: this process has not made its namespaces yet (a dead
        // run's PID can be reused, in a container especially).
        if pid == std::process::id() || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            remove(&name);
        }
    }
}
