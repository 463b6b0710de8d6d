//! `qgate pki …`: a CA for a small fleet and the device and gateway certificates it issues
//! (issue 49). Keys are written readable by their owner only; nothing is overwritten.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use qgate_transport::pki::{self, Issued, Role, Validity};
use qgate_transport::token::TokenSigner;

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
        #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36_500))]
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
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36_500))]
        days: u32,
        /// A server certificate (a gateway's device port) instead of a client's.
        #[arg(long)]
        server: bool,
    },
    /// Make a token-signing key for devices that cannot hold a certificate: DIR/token.key
    /// (keep it off the gateway) and DIR/token.pub (the gateway's device_token_key).
    TokenKey {
        /// Where to write token.key and token.pub.
        dir: PathBuf,
    },
    /// Print a token for device NAME, signed with DIR/token.key: a JSON Web Token (EdDSA) the
    /// device sends as `authorization: Bearer …` (`qgate device --token FILE`).
    Token {
        /// The device's name: 1 to 64 visible ASCII characters.
        name: String,
        /// The directory holding token.key.
        #[arg(long, value_name = "DIR")]
        key: PathBuf,
        /// Days it is valid.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=36_500))]
        days: u32,
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
        PkiCommand::TokenKey { dir } => {
            let (key_pem, signer) = TokenSigner::generate().map_err(usage)?;
            std::fs::create_dir_all(&dir).map_err(|e| usage(format!("{}: {e}", dir.display())))?;
            write_files(
                &dir,
                &[
                    ("token.key".into(), &key_pem, true),
                    ("token.pub".into(), &signer.public_pem(), false),
                ],
            )?;
            println!(
                "token key in {}: token.pub (the gateway's device_token_key), token.key (keep it off the gateway)",
                dir.display()
            );
            Ok(())
        }
        PkiCommand::Token { name, key, days } => {
            check_name(&name)?;
            let path = key.join("token.key");
            let pem = std::fs::read_to_string(&path).map_err(|e| {
                usage(format!(
                    "{}: {e} (make it first: qgate pki token-key {})",
                    path.display(),
                    key.display()
                ))
            })?;
            let signer = TokenSigner::from_pem(&pem)
                .map_err(|e| usage(format!("{}: {e}", path.display())))?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            println!("{}", signer.token(&name, now, u64::from(days) * 86_400));
            Ok(())
        }
        PkiCommand::Issue {
            name,
            ca,
            out,
            days,
            server,
        } => {
            check_name(&name)?;
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

/// A device name a certificate or token may carry (and a file may be named after).
fn check_name(name: &str) -> Result<(), Failure> {
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
    Ok(())
}

/// Write `stem.pem` and `stem.key` (owner-only) in `dir`, refusing to replace either.
fn write_pair(dir: &Path, stem: &str, issued: &Issued) -> Result<(), Failure> {
    write_files(
        dir,
        &[
            (format!("{stem}.key"), &issued.key_pem, true),
            (format!("{stem}.pem"), &issued.cert_pem, false),
        ],
    )
}

/// Write each (name, text, private) in `dir`, private ones owner-only, refusing to replace any
/// file (checked before anything is written).
fn write_files(dir: &Path, files: &[(String, &String, bool)]) -> Result<(), Failure> {
    use std::io::Write;
    if let Some((name, ..)) = files.iter().find(|(n, ..)| dir.join(n).exists()) {
        return Err(usage(format!(
            "{}: exists (nothing is overwritten: remove it first to replace it)",
            dir.join(name).display()
        )));
    }
    for (file, data, private) in files {
        let path = dir.join(file);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        if *private {
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
