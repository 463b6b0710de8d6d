//! Prometheus exposition through one maintained library, `prometheus-client` (decision O1).
//!
//! Daemons keep the atomic counters their hot paths already update and hand the registry a
//! [`Collector`] that reads them at scrape time; these helpers keep each metric to one call.
//! Counter names are given without `_total`: the OpenMetrics encoder appends it.

use std::fmt;

pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
pub use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::Registry;

use prometheus_client::encoding::{EncodeGaugeValue, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A label set of one `name="value"` pair.
pub type Label<'a> = [(&'static str, &'a str); 1];

/// One unlabelled counter.
pub fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

/// One unlabelled gauge.
pub fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: impl EncodeGaugeValue,
) -> fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

/// A counter per label set; nothing at all when `rows` is empty.
pub fn counters<L: EncodeLabelSet>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    family(e, name, help, MetricType::Counter, rows, |mut m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(v, None)
    })
}

/// A gauge per label set; nothing at all when `rows` is empty.
pub fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    family(e, name, help, MetricType::Gauge, rows, |mut m, v| {
        m.encode_gauge(v)
    })
}

/// A histogram per label set.
pub fn histograms<'h, L: EncodeLabelSet>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, &'h Histogram)>,
) -> fmt::Result {
    family(e, name, help, MetricType::Histogram, rows, |m, h| {
        h.encode(m)
    })
}

fn family<L: EncodeLabelSet, V>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (L, V)>,
    mut put: impl FnMut(prometheus_client::encoding::MetricEncoder, &V) -> fmt::Result,
) -> fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        put(m.encode_family(&labels)?, &v)?;
    }
    Ok(())
}

/// The registry's text (OpenMetrics, ends in `# EOF`).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// One collector's text, as a registry holding only it would expose it (tests, the lab).
pub fn render(collector: impl Collector) -> String {
    let mut r = Registry::default();
    r.register_collector(Box::new(collector));
    encode(&r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Sample;

    impl Collector for Sample {
        fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
            counter(&mut e, "x_sent", "things sent", 3)?;
            gauge(&mut e, "x_up", "whether up", 1u64)?;
            gauges(
                &mut e,
                "x_depth",
                "held",
                [([("queue", "a\"b")], 2u64), ([("queue", "c")], 0)],
            )?;
            counters::<Label>(&mut e, "x_none", "absent", [])?;
            let h = Histogram::new([0.1, 1.0]);
            h.observe(0.5);
            histograms(&mut e, "x_delay_seconds", "delay", [([("class", "p")], &h)])
        }
    }

    #[test]
    fn text_is_openmetrics_with_escaped_labels_and_no_empty_families() {
        let t = render(Sample);
        assert!(t.contains("# TYPE x_sent counter\nx_sent_total 3\n"), "{t}");
        assert!(t.contains("x_up 1\n"), "{t}");
        assert!(t.contains("x_depth{queue=\"a\\\"b\"} 2\n"), "{t}");
        assert!(!t.contains("x_none"), "{t}");
        assert!(
            t.contains("x_delay_seconds_bucket{le=\"1.0\",class=\"p\"} 1\n"),
            "{t}"
        );
        assert!(t.ends_with("# EOF\n"), "{t}");
    }
}
