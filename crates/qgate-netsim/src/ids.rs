//! The names of a network's parts: hosts, interfaces, links and a link's two directions (plain
//! indices, shared by the handle, the state and the traces).

/// A host in the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(pub(crate) usize);
/// An interface (one address) of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InterfaceId(pub(crate) usize);
/// A point-to-point link between two interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct LinkId(pub(crate) usize);

/// One direction of a link: from the first interface given to
/// [`Network::connect`](crate::Network::connect) to the second (`AtoB`), or back (`BtoA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Direction {
    /// From the link's first interface to its second.
    AtoB,
    /// From the link's second interface to its first.
    BtoA,
}

impl Direction {
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The other direction of the same link.
    pub fn reverse(self) -> Direction {
        match self {
            Direction::AtoB => Direction::BtoA,
            Direction::BtoA => Direction::AtoB,
        }
    }
}
