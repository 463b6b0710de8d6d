//! The small valid plan the plan module's tests vary, and how they load it.

use std::path::Path;

use super::error::PlanError;
use super::loaded::Loaded;

pub(super) const PLAN: &str = r#"
[plan]
name = "t"
duration_s = 10
seeds = 2

[topology]
hosts = [{ name = "c" }, { name = "s" }]
[[topology.links]]
name = "l"
a = "c"
b = "s"
rate_mbps = 10
delay_ms = 5

[[workloads]]
kind = "downloads"
name = "dl"
client = "c"
server = "s"
bytes = 100000
runs = 3

[[schemes]]
name = "off"
[[schemes]]
name = "ewma"
set = { "workloads.dl.history" = "ewma" }

[sweep]
label = "delay (ms)"
key = "topology.links.l.delay_ms"
values = [5, 50]
"#;

pub(super) fn load(text: &str) -> Result<Loaded, PlanError> {
    Loaded::parse(text, Path::new("p.toml"))
}
