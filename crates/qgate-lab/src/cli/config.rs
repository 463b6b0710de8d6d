//! `qgate-lab --config FILE`: the lab's own tables. The product's file (`qgate --config`) has
//! none of them, so a daemon's configuration never carries a simulator's settings.

use std::path::Path;

use anyhow::Context;
use qgate_transport::TransportOptions;
use serde::Deserialize;

use crate::demo::transport::DemoConfig;

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LabConfig {
    /// `[demo]`: the direct demo's network and clients.
    pub demo: DemoConfig,
    /// `[transport]`: QUIC settings of the direct demo's server and clients.
    pub transport: TransportOptions,
    /// `[linkem]`, `[[linkem.path]]`, `[[linkem.timeline]]`: real-time link emulation.
    pub linkem: qgate_linkem::LinkemConfig,
}

impl LabConfig {
    /// Read and check a file; errors name the file and, for syntax, line and column.
    pub fn load(path: &Path) -> anyhow::Result<LabConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        LabConfig::parse(&text, &path.display().to_string())
    }

    /// Parse and check a file's `text`; errors name `origin` (the file).
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<LabConfig> {
        let cfg: LabConfig = qgate::config::parse_toml(text, origin)?;
        cfg.transport
            .validate()
            .map_err(|e| anyhow::anyhow!("config file {origin}: [transport] {e}"))?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Found by the `config` fuzz target: a delay of 4.1e56 ms overflowed the conversion to a
    /// `Duration` while the file was parsed (a panic); it is now a clear error.
    #[test]
    fn an_absurd_link_delay_is_an_error_not_a_panic() {
        let text = "[demo.backbone]\nrate_bps = 10000000\ndelay = 409999999999999999999999999999999999999999999999999999999.0\n";
        let e = LabConfig::parse(text, "x.toml").unwrap_err().to_string();
        assert!(e.contains("x.toml") && e.contains("a delay must be"), "{e}");
    }

    #[test]
    fn demo_tables_parse_and_product_tables_are_refused() {
        let cfg = LabConfig::parse(
            r#"
            [transport]
            congestion = "new-reno"
            [demo]
            clients = 3
            [demo.backbone]
            rate_bps = 1000000
            delay = 40.0
            loss = { kind = "bernoulli", p = 0.01 }
            queue = { kind = "droptail", packets = 50 }
            "#,
            "lab.toml",
        )
        .unwrap();
        assert_eq!(cfg.demo.clients, 3);
        assert_eq!(cfg.demo.backbone.delay, Duration::from_millis(40));
        let e = LabConfig::parse("[gateway]\nscheduler = \"single\"\n", "lab.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway") && e.contains("lab.toml"), "{e}");
    }
}
