//! A plan's runs: the plan with `[plan.quick]` and `--set` applied, then every sweep point ×
//! scheme × seed with its own overrides, each checked before the first runs.

use super::check::{check, MAX_RUNS, MAX_SEEDS};
use super::error::{described, plain, PlanError};
use super::loaded::Loaded;
use super::overrides;
use super::spec::Plan;

/// What the command line changes.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Seeds per run (instead of the plan's).
    pub seeds: Option<u64>,
    /// Use `[plan.quick]`.
    pub quick: bool,
    /// `--set key=value` overrides, applied before the sweep point's and the scheme's.
    pub set: Vec<(String, toml::Value)>,
    /// Only these schemes (all when empty).
    pub schemes: Vec<String>,
    /// Only these points of each sweep, by position (all when `None`).
    pub points: Option<Vec<usize>>,
}

/// A sweep point: which sweep, its position in it, its x.
#[derive(Debug, Clone, PartialEq)]
pub struct At {
    /// The sweep's name.
    pub sweep: String,
    /// Position in the sweep.
    pub index: usize,
    /// The x value.
    pub x: f64,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {}", self.sweep, self.x)
    }
}

/// One run to make.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Scheme name.
    pub scheme: String,
    /// Sweep point, if the plan sweeps.
    pub point: Option<At>,
    /// Seed.
    pub seed: u64,
    /// The plan with every override applied.
    pub plan: Plan,
}

impl Variant {
    /// "scheme at sweep = x seed n", for progress and errors.
    pub fn label(&self) -> String {
        match &self.point {
            Some(p) => format!("{} at {p} seed {}", self.scheme, self.seed),
            None => format!("{} seed {}", self.scheme, self.seed),
        }
    }
}

/// A scheme's or sweep point's `set` changes one run, so it cannot reach keys that shape the
/// whole plan (its runs, seeds, figures or name): those would be silently ignored.
fn per_run_keys(set: &toml::Table) -> Result<(), String> {
    const WHOLE_PLAN: [&str; 3] = ["sweep", "schemes", "figures"];
    const WHOLE_PLAN_FIELDS: [&str; 4] = ["seeds", "name", "quick", "metrics"];
    for (key, value) in set {
        let mut parts = key.split('.');
        let first = parts.next().unwrap_or_default();
        let plan_fields: Vec<&str> = match (first, parts.next()) {
            ("plan", Some(field)) => vec![field],
            ("plan", None) => value
                .as_table()
                .map(|t| t.keys().map(String::as_str).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if WHOLE_PLAN.contains(&first) || plan_fields.iter().any(|f| WHOLE_PLAN_FIELDS.contains(f))
        {
            return Err(format!(
                "'{key}' applies to the whole plan, not one run: set it in the plan or with --set"
            ));
        }
    }
    Ok(())
}

impl Loaded {
    /// The plan with `[plan.quick]` (when asked) and the `--set` overrides applied: what the
    /// runs, the summary and the figures use (seeds, sweeps, schemes, figures, name included).
    pub fn overridden(&self, opts: &Options) -> Result<Loaded, PlanError> {
        let mut doc = self.doc.clone();
        let err = |m: String| self.error(m);
        if opts.quick {
            let q = &self.plan.plan.quick;
            if let Some(d) = q.duration_s {
                overrides::apply(&mut doc, "plan.duration_s", toml::Value::Float(d))
                    .map_err(|m| err(format!("plan.quick.duration_s: {m}")))?;
            }
            overrides::apply_table(&mut doc, &q.set)
                .map_err(|m| err(format!("plan.quick.set: {m}")))?;
        }
        // Each --set is tried as it is applied: an error is the command line's, not a line of
        // the file's.
        let cli = |m: String| PlanError {
            file: self.file.display().to_string(),
            line: None,
            message: m,
        };
        for (k, v) in &opts.set {
            overrides::apply(&mut doc, k, v.clone()).map_err(|m| cli(format!("--set {k}: {m}")))?;
            if let Err(e) = toml::Value::Table(doc.clone()).try_into::<Plan>() {
                return Err(cli(format!("--set {k}: {}", plain(e.message()))));
            }
        }
        let plan: Plan = toml::Value::Table(doc.clone())
            .try_into()
            .map_err(|e: toml::de::Error| err(format!("with the overrides: {}", described(&e))))?;
        check(&plan, "with the overrides: ").map_err(err)?;
        Ok(Loaded {
            file: self.file.clone(),
            text: self.text.clone(),
            doc,
            plan,
        })
    }

    /// Every run: for each sweep point, each scheme, each seed.
    pub fn variants(&self, opts: &Options) -> Result<Vec<Variant>, PlanError> {
        let eff = self.overridden(opts)?;
        let base = eff.doc.clone();
        let err = |m: String| self.error(m);
        let quick = &eff.plan.plan.quick;
        let seeds = opts.seeds.unwrap_or(if opts.quick {
            quick.seeds.unwrap_or(1)
        } else {
            eff.plan.plan.seeds
        });
        if seeds == 0 || seeds > MAX_SEEDS {
            return Err(err(format!(
                "seeds must be in 1..={MAX_SEEDS}, not {seeds}"
            )));
        }
        let mut points: Vec<(Option<At>, toml::Table)> = Vec::new();
        for s in &eff.plan.sweep {
            if opts.quick && quick.sweeps.as_ref().is_some_and(|k| !k.contains(&s.name)) {
                continue;
            }
            let keep = |i: usize| {
                (!opts.quick || quick.sweep_points.as_ref().is_none_or(|k| k.contains(&i)))
                    && opts.points.as_ref().is_none_or(|k| k.contains(&i))
            };
            let at = |index: usize, x: f64| At {
                sweep: s.name.clone(),
                index,
                x,
            };
            if let Some(key) = &s.key {
                for (i, v) in s.values.iter().enumerate().filter(|(i, _)| keep(*i)) {
                    let x = v
                        .as_float()
                        .or(v.as_integer().map(|i| i as f64))
                        .unwrap_or(i as f64);
                    let mut t = s.set.clone();
                    t.insert(key.clone(), v.clone());
                    points.push((Some(at(i, x)), t));
                }
            } else {
                for (i, p) in s.points.iter().enumerate().filter(|(i, _)| keep(*i)) {
                    let mut t = s.set.clone();
                    t.extend(p.set.clone());
                    points.push((Some(at(i, p.x)), t));
                }
            }
        }
        if eff.plan.sweep.is_empty() {
            points.push((None, toml::Table::new()));
        }
        let schemes: Vec<(String, toml::Table)> = if eff.plan.schemes.is_empty() {
            vec![("base".into(), toml::Table::new())]
        } else {
            eff.plan
                .schemes
                .iter()
                .map(|s| (s.name.clone(), s.set.clone()))
                .collect()
        };
        let known = eff.scheme_names();
        if let Some(bad) = opts.schemes.iter().find(|s| !known.contains(s)) {
            return Err(err(format!(
                "no scheme '{bad}' (the plan has: {})",
                known.join(", ")
            )));
        }
        let schemes: Vec<(String, toml::Table)> = schemes
            .into_iter()
            .filter(|(name, _)| opts.schemes.is_empty() || opts.schemes.contains(name))
            .collect();
        // A scheme's `set` is applied last and wins: a key every scheme sets cannot be varied
        // by a sweep or --set, which would silently change nothing.
        let overridden_by_all = |key: &str| {
            !eff.plan.schemes.is_empty()
                && schemes.iter().all(|(_, set)| {
                    set.keys().any(|k| {
                        key == k
                            || key
                                .strip_prefix(k.as_str())
                                .is_some_and(|r| r.starts_with('.'))
                    })
                })
        };
        for sw in &eff.plan.sweep {
            let keys = sw
                .key
                .iter()
                .chain(sw.set.keys())
                .chain(sw.points.iter().flat_map(|p| p.set.keys()));
            for k in keys {
                if overridden_by_all(k) {
                    return Err(err(format!(
                        "sweep '{}' sets '{k}', which every scheme sets too, and a scheme's value wins: the sweep would change nothing (vary it in the schemes, or drop it from them)",
                        sw.name
                    )));
                }
            }
        }
        for (k, _) in &opts.set {
            if overridden_by_all(k) {
                return Err(err(format!(
                    "--set {k}: every scheme sets '{k}' itself, and a scheme's value wins: the override would change nothing"
                )));
            }
        }
        let runs = points.len() as u64 * schemes.len() as u64 * seeds;
        if runs > MAX_RUNS {
            return Err(err(format!(
                "{runs} runs ({} point(s) × {} scheme(s) × {seeds} seed(s)): at most {MAX_RUNS}",
                points.len(),
                schemes.len()
            )));
        }
        let mut out = Vec::new();
        for (point, pset) in &points {
            for (scheme, sset) in &schemes {
                let with_set = if opts.set.is_empty() {
                    ""
                } else {
                    " (with --set)"
                };
                let at = match point {
                    Some(p) => format!("scheme '{scheme}' at {p}{with_set}: "),
                    None => format!("scheme '{scheme}'{with_set}: "),
                };
                per_run_keys(pset)
                    .and_then(|_| per_run_keys(sset))
                    .map_err(|m| err(format!("{at}{m}")))?;
                let mut doc = base.clone();
                overrides::apply_table(&mut doc, pset)
                    .and_then(|_| overrides::apply_table(&mut doc, sset))
                    .map_err(|m| err(format!("{at}{m}")))?;
                let plan: Plan = toml::Value::Table(doc)
                    .try_into()
                    .map_err(|e: toml::de::Error| err(format!("{at}{}", described(&e))))?;
                check(&plan, &at).map_err(err)?;
                for seed in 1..=seeds {
                    out.push(Variant {
                        scheme: scheme.clone(),
                        point: point.clone(),
                        seed,
                        plan: plan.clone(),
                    });
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{At, Options};
    use crate::plan::spec;
    use crate::plan::testing::{load, PLAN};

    #[test]
    fn a_sweep_or_set_of_a_key_every_scheme_sets_is_refused() {
        // Both schemes set the history: a sweep over it would change nothing.
        let plan = PLAN
            .replace(
                "name = \"off\"\n",
                "name = \"off\"\nset = { \"workloads.dl.history\" = \"off\" }\n",
            )
            .replace(
                "key = \"topology.links.l.delay_ms\"\nvalues = [5, 50]",
                "key = \"workloads.dl.history\"\nvalues = [\"off\", \"ewma\"]",
            );
        let e = load(&plan)
            .unwrap()
            .variants(&Options::default())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("sweep 'sweep' sets 'workloads.dl.history', which every scheme sets too"),
            "{e}"
        );
        // A scheme setting a whole table covers the keys under it.
        let plan = PLAN.replace(
            "name = \"off\"\n",
            "name = \"off\"\nset = { \"topology.links.l\" = { name = \"l\", a = \"c\", b = \"s\", rate_mbps = 10 } }\n",
        ).replace("set = { \"workloads.dl.history\" = \"ewma\" }", "set = { \"workloads.dl.history\" = \"ewma\", \"topology.links.l.delay_ms\" = 5 }");
        let e = load(&plan)
            .unwrap()
            .variants(&Options::default())
            .unwrap_err();
        assert!(
            e.to_string().contains("sets 'topology.links.l.delay_ms'"),
            "{e}"
        );
        // --set of a key only one scheme sets is fine; of one both set, refused.
        let l = load(PLAN).unwrap();
        let set = |k: &str, v: toml::Value| Options {
            set: vec![(k.into(), v)],
            ..Default::default()
        };
        assert!(l
            .variants(&set("workloads.dl.history", "mean".into()))
            .is_ok());
        let plan = PLAN.replace(
            "name = \"off\"\n",
            "name = \"off\"\nset = { \"workloads.dl.history\" = \"off\" }\n",
        );
        let e = load(&plan)
            .unwrap()
            .variants(&set("workloads.dl.history", "mean".into()))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("--set workloads.dl.history: every scheme sets"),
            "{e}"
        );
    }

    #[test]
    fn expands_points_schemes_and_seeds_with_overrides() {
        let l = load(PLAN).unwrap();
        let v = l.variants(&Options::default()).unwrap();
        assert_eq!(v.len(), 2 * 2 * 2);
        let last = v.last().unwrap();
        assert_eq!(last.scheme, "ewma");
        assert_eq!(last.seed, 2);
        assert_eq!(
            last.point,
            Some(At {
                sweep: "sweep".into(),
                index: 1,
                x: 50.0
            })
        );
        assert_eq!(last.plan.topology.links[0].both.delay_ms, Some(50.0));
        let spec::Workload::Downloads(d) = &last.plan.workloads[0] else {
            panic!()
        };
        assert_eq!(d.history, spec::HistoryMode::Ewma);
        let spec::Workload::Downloads(d) = &v[0].plan.workloads[0] else {
            panic!()
        };
        assert_eq!(d.history, spec::HistoryMode::Off);
        let q = l
            .variants(&Options {
                quick: true,
                seeds: None,
                set: vec![("plan.duration_s".into(), toml::Value::Float(3.0))],
                ..Default::default()
            })
            .unwrap();
        assert_eq!(q.len(), 2 * 2);
        assert_eq!(q[0].plan.plan.duration_s, 3.0);
    }

    #[test]
    fn a_sweep_set_applies_to_each_of_its_points_under_the_points_own() {
        let grid = PLAN.replace(
            "values = [5, 50]",
            "values = [5, 50]\nset = { \"topology.links.l.rate_mbps\" = 2 }",
        );
        let v = load(&grid).unwrap().variants(&Options::default()).unwrap();
        let link = |i: usize| &v[i].plan.topology.links[0].both;
        // The sweep's `set` reaches every point beside its own key.
        assert_eq!(
            (link(0).delay_ms, link(0).rate_mbps),
            (Some(5.0), Some(2.0))
        );
        let last = v.len() - 1;
        assert_eq!(
            (link(last).delay_ms, link(last).rate_mbps),
            (Some(50.0), Some(2.0))
        );
        let bad = PLAN.replace(
            "values = [5, 50]",
            "values = [5, 50]\nset = { \"plan.seeds\" = 3 }",
        );
        let e = load(&bad)
            .unwrap()
            .variants(&Options::default())
            .unwrap_err();
        assert!(e.to_string().contains("whole plan"), "{e}");
        let both = PLAN.replace(
            "values = [5, 50]",
            "values = [5, 50]\nset = { \"topology.links.l\" = { rate_mbps = 3 } }",
        );
        let e = load(&both).unwrap_err();
        assert!(e.to_string().contains("give each key in one place"), "{e}");
    }

    #[test]
    fn set_reaches_plan_level_keys() {
        let l = load(PLAN).unwrap();
        let opts = Options {
            set: vec![
                ("plan.seeds".into(), 1.into()),
                ("sweep.values".into(), toml::Value::Array(vec![7.into()])),
            ],
            ..Default::default()
        };
        let v = l.variants(&opts).unwrap();
        assert_eq!(v.len(), 2, "one point × two schemes × one seed");
        assert_eq!(v[0].point.as_ref().unwrap().x, 7.0);
        assert_eq!(l.overridden(&opts).unwrap().plan.plan.seeds, 1);
        let bad = Options {
            set: vec![("schemes.ewma.name".into(), "a,b".into())],
            ..Default::default()
        };
        assert!(l
            .variants(&bad)
            .unwrap_err()
            .message
            .contains("'schemes.name'"));
        // A scheme renamed with --set runs under its new name (the report reads the same list).
        let renamed = Options {
            set: vec![("schemes.ewma.name".into(), "avg".into())],
            ..Default::default()
        };
        let names: Vec<String> = l
            .variants(&renamed)
            .unwrap()
            .iter()
            .map(|v| v.scheme.clone())
            .collect();
        assert!(names.contains(&"avg".to_string()) && !names.contains(&"ewma".to_string()));
        // A scheme cannot change what shapes the whole plan: it would be ignored.
        for key in ["plan.seeds", "sweep.values", "figures"] {
            let l = load(&PLAN.replacen(
                "set = { \"workloads.dl.history\" = \"ewma\" }",
                &format!("set = {{ \"{key}\" = 3 }}"),
                1,
            ))
            .unwrap();
            let e = l.variants(&Options::default()).unwrap_err();
            assert!(
                e.message.contains("applies to the whole plan"),
                "{key}: {e}"
            );
        }
    }
}
