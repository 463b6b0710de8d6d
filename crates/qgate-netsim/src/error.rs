//! Why a network operation was refused.

use std::net::{IpAddr, SocketAddr};

/// Why a network operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// Another interface already has this address.
    #[error("address {0} is already assigned to an interface")]
    AddressTaken(IpAddr),
    /// The interface is already connected to a link (links are point-to-point).
    #[error("interface {0} is already connected to a link")]
    InterfaceBusy(IpAddr),
    /// The host has no interface with this address.
    #[error("host '{host}' has no interface with address {addr}")]
    NoSuchAddress {
        /// The host's name.
        host: String,
        /// The address asked for.
        addr: IpAddr,
    },
    /// A socket is already bound to this address and port.
    #[error("address {0} is already in use")]
    AddrInUse(SocketAddr),
    /// The host's ephemeral ports are all bound.
    #[error("no free ephemeral port on host '{0}'")]
    NoFreePort(String),
    /// Link parameters failed validation.
    #[error("invalid link parameters: {0}")]
    BadParams(String),
}
