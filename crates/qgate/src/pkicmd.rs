//! `qgate pki …`: a CA for a small fleet and the device and gateway certificates it issues
//! (issue 49). Keys are written readable by their owner only; nothing is overwritten.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use qgate_transport::pki::{self, Issued, Role, Validity};

use crate::{usage, Failure};

#[derive(Args, Debug)]
pub struct PkiArgs {
    #[command(subcommand)]
    command: PkiCommand,
}

#[derive(Subcommand, Debug)]
enum PkiCommand {
    /// Make a CA: DIR/ca.pem (give it to the gateway as device_ca) and DIR/ca.key (keep it
    /// offline).
    Ca {
        /// Where to write ca.pem and ca.key.
        dir: PathBuf,
        /// The CA's name.
        #[arg(long, default_value = "qgate device CA")]
        name: String,
        /// Days it is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a certificate for NAME signed by the CA in --ca: OUT/NAME.pem and OUT/NAME.key. A
    /// device is known by NAME at the gateway (its common name, and its DNS name when NAME is
    /// one).
    Issue {
        /// The device's (or gateway's) name: 1 to 64 visible ASCII characters.
        name: String,
        /// The CA's directory (from `qgate pki ca`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// Where to write NAME.pem and NAME.key [default: the CA's directory].
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Days it is valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// A server certificate (a gateway's device port) instead of a client's.
        #[arg(long)]
        server: bool,
    },
}

pub fn run(a: PkiArgs) -> Result<(), Failure> {
    match a.command {
        PkiCommand::Ca { dir, name, days } => {
            let ca = pki::new_ca(&name, Validity::days(days)).map_err(usage)?;
            std::fs::create_dir_all(&dir).map_err(|e| usage(format!("{}: {e}", dir.display())))?;
            write_pair(&dir, "ca", &ca)?;
            println!(
                "CA {name:?} in {}: ca.pem (the gateway's device_ca), ca.key (keep it safe)",
                dir.display()
            );
            Ok(())
        }
        PkiCommand::Issue {
            name,
            ca,
            out,
            days,
            server,
        } => {
            if name.is_empty()
                || name.len() > qgate_transport::peer_id::MAX_IDENTITY
                || !name.bytes().all(|b| b.is_ascii_graphic())
                || name.contains('/')
            {
                return Err(usage(format!(
                    "{name:?}: a name is 1 to {} visible ASCII characters, no '/'",
                    qgate_transport::peer_id::MAX_IDENTITY
                )));
            }
            let read = |f: &str| {
                let p = ca.join(f);
                std::fs::read_to_string(&p).map_err(|e| {
                    usage(format!(
                        "{}: {e} (make the CA first: qgate pki ca {})",
                        p.display(),
                        ca.display()
                    ))
                })
            };
            let authority = Issued {
                cert_pem: read("ca.pem")?,
                key_pem: read("ca.key")?,
            };
            let role = if server { Role::Server } else { Role::Client };
            let issued =
                pki::issue(&authority, &name, role, Validity::days(days)).map_err(usage)?;
            let out = out.unwrap_or(ca);
            std::fs::create_dir_all(&out).map_err(|e| usage(format!("{}: {e}", out.display())))?;
            write_pair(&out, &name, &issued)?;
            println!(
                "{name}: {} and {}, valid {days} days",
                out.join(format!("{name}.pem")).display(),
                out.join(format!("{name}.key")).display()
            );
            Ok(())
        }
    }
}

/// Write `stem.pem` and `stem.key` (owner-only) in `dir`, refusing to replace either.
fn write_pair(dir: &Path, stem: &str, issued: &Issued) -> Result<(), Failure> {
    use std::io::Write;
    for (file, data, private) in [
        (format!("{stem}.key"), &issued.key_pem, true),
        (format!("{stem}.pem"), &issued.cert_pem, false),
    ] {
        let path = dir.join(&file);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        if private {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&path).map_err(|e| {
            usage(format!(
                "{}: {e} (nothing is overwritten: remove it first to replace it)",
                path.display()
            ))
        })?;
        f.write_all(data.as_bytes())
            .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}
