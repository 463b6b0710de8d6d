//! What the broker holds: any AMQP message, its stored form, and the copies it sends.

use std::sync::Arc;

use fe2o3_amqp::link::delivery::Sendable;
use fe2o3_amqp::types::messaging::message::__private::{Deserializable, Serializable};
use fe2o3_amqp::types::messaging::{Body, Message};
use fe2o3_amqp::types::primitives::Value;

/// What the broker stores and forwards: any AMQP message, body kept as decoded values.
pub type AmqpMessage = Message<Body<Value>>;
pub(super) type Item = Arc<Sendable<Body<Value>>>;

/// Encode a message as AMQP 1.0 sections (what the store keeps).
pub fn encode(msg: &AmqpMessage) -> Vec<u8> {
    serde_amqp::to_vec(&Serializable(msg)).expect("a decoded message encodes")
}

/// Decode sections written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<AmqpMessage, String> {
    serde_amqp::from_slice::<Deserializable<AmqpMessage>>(bytes)
        .map(|d| d.0)
        .map_err(|e| e.to_string())
}

pub(super) fn sendable(msg: AmqpMessage) -> Sendable<Body<Value>> {
    Sendable::builder().message(msg).build()
}

/// A copy for redelivery with the header's delivery-count and first-acquirer updated (AMQP 1.0
/// §3.2.1).
pub(super) fn redelivered(item: &Sendable<Body<Value>>, count: u32) -> Sendable<Body<Value>> {
    let mut s = item.clone();
    let h = s.message.header.get_or_insert_with(Default::default);
    h.delivery_count = h.delivery_count.max(count);
    h.first_acquirer = false;
    s
}
