//! A bounded packet trace that experiments read (time, link, size, event, queue occupancy).

use std::time::Duration;

use serde::Serialize;

use crate::{Direction, LinkId, TraceEvent};

/// One trace record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TraceRecord {
    /// When, since the network was created (exact event time, not rounded to clock ticks).
    pub at: Duration,
    /// Which link.
    pub link: LinkId,
    /// Which direction.
    pub dir: Direction,
    /// Packet size on the wire, bytes.
    pub size: usize,
    /// What happened.
    pub event: TraceEvent,
    /// Packets queued after the event.
    pub queue_packets: usize,
    /// Bytes queued after the event.
    pub queue_bytes: usize,
}

/// A bounded list of trace records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// The records, in event order.
    pub records: Vec<TraceRecord>,
    /// Records not kept because the limit was reached.
    pub truncated: u64,
    limit: usize,
}

impl Trace {
    pub(crate) fn new(limit: usize) -> Trace {
        Trace {
            records: Vec::new(),
            truncated: 0,
            limit,
        }
    }

    pub(crate) fn push(&mut self, r: TraceRecord) {
        if self.records.len() < self.limit {
            self.records.push(r);
        } else {
            self.truncated += 1;
        }
    }

    pub(crate) fn take(&mut self) -> Trace {
        std::mem::replace(self, Trace::new(self.limit))
    }

    /// Write the trace as CSV (`at_ns,link,dir,size,event,queue_packets,queue_bytes`).
    pub fn write_csv(&self, mut w: impl std::io::Write) -> std::io::Result<()> {
        writeln!(w, "at_ns,link,dir,size,event,queue_packets,queue_bytes")?;
        for r in &self.records {
            let ev = r.event.as_str();
            let dir = match r.dir {
                Direction::AtoB => "a-b",
                Direction::BtoA => "b-a",
            };
            writeln!(
                w,
                "{},{},{},{},{},{},{}",
                r.at.as_nanos(),
                r.link.0,
                dir,
                r.size,
                ev,
                r.queue_packets,
                r.queue_bytes
            )?;
        }
        Ok(())
    }
}
