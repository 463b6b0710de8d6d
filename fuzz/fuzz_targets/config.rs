//! What an operator types (qgate's and qgate-lab's config files, URLs, durations, queue-discipline strings) on
//! arbitrary text: every input is accepted or refused with an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = qgate::config::Config::parse(text, "fuzz.toml") {
        let _ = format!("{cfg:?}");
    }
    // The lab's own tables, with the checks `qgate-lab demo` makes before it builds anything.
    if let Ok(cfg) = qgate_lab::cli::config::LabConfig::parse(text, "fuzz.toml") {
        let _ = cfg.demo.validate();
        let _ = format!("{cfg:?}");
    }
    let _ = qgate::config::parse_duration(text);
    if let Ok(t) = qgate::url::parse(text) {
        let _ = format!("{t:?}");
    }
    if let Ok(spec) = text.parse::<qgate_aqm::DisciplineSpec>() {
        let _ = spec.validate();
    }
});
