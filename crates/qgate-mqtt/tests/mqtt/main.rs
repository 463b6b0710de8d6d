//! Integration tests of qgate-mqtt through its public API: spec byte vectors, emit/parse round
//! trips for every packet in both versions, and the connection state machine.

mod connection;
mod harness;
mod roundtrip;
mod spec_bytes;
mod strategies;
