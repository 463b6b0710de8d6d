//! Where the upload receiver's disk work runs: the provider shared with the gateway's spool
//! ([`qgate_core::disk`], decision U12).

pub use qgate_core::disk::DiskRunner;
