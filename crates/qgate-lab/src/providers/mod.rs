//! What the lab plugs into the product's providers: measurement and determinism that the
//! product offers hooks for and never builds in.

mod charged;
mod inline_disk;

pub use charged::Charged;
pub use inline_disk::InlineDisk;
