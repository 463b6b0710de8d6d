//! What the spool counts, declared once (decision W4): the admin API's snapshot and the
//! gateway's `/metrics` both come from here.

qgate_core::counters! {
    /// What the spool has done and holds.
    pub struct SpoolStats => SpoolSnapshot {
        /// Records written and answered as stored.
        spooled: counter "qgate_spool_spooled", "records spooled (answered as stored)";
        /// Spooled records the server has since taken.
        drained: counter "qgate_spool_drained", "spooled records the server has taken";
        /// Spooled records the server refused for good (a 4xx): dropped, counted.
        rejected: counter "qgate_spool_rejected", "spooled records the server refused for good";
        /// Records dropped because they waited longer than the age limit.
        expired: counter "qgate_spool_expired", "spooled records dropped past the age limit";
        /// Best-effort records dropped to make room (the drop-oldest policy).
        dropped: counter "qgate_spool_dropped", "best-effort records dropped to make room";
        /// Records purged by the operator.
        purged: counter "qgate_spool_purged", "spooled records purged by the operator";
        /// Records refused: the spool was full.
        refused_full: counter "qgate_spool_refused_full", "records refused: the spool was full";
        /// Records refused: their device held its whole share.
        refused_share: counter "qgate_spool_refused_share", "records refused: their device held its share";
        /// Records refused: the spool was off after a disk error, or the disk kept too little free.
        refused_unavailable: counter "qgate_spool_refused_unavailable", "records refused: the spool's disk failed or is nearly full";
        /// Torn or corrupted tails cut at start, and segments found corrupted since.
        torn: counter "qgate_spool_torn", "torn or corrupted segment tails cut";
        /// Priority records held now.
        held_priority: gauge "qgate_spool_held_priority_records", "priority records held";
        /// Best-effort records held now.
        held_best_effort: gauge "qgate_spool_held_best_effort_records", "best-effort records held";
        /// Bytes held now (frames on disk, both classes).
        held_bytes: gauge "qgate_spool_held_bytes", "bytes held (frames on disk)";
    }
}
