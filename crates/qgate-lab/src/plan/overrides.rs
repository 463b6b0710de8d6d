//! Overrides of a plan document: `"path.to.key" = value`, as schemes, sweep points, `--quick`
//! and `--set` give them. A path walks tables by key and arrays of tables by an element's
//! `name` (or its position); missing tables on the way are created; a table value merges into
//! the table it lands on, anything else replaces.

/// Apply every entry of `set` to `doc`.
pub fn apply_table(doc: &mut toml::Table, set: &toml::Table) -> Result<(), String> {
    for (k, v) in set {
        apply(doc, k, v.clone())?;
    }
    Ok(())
}

/// Set `path` in `doc` to `value`.
pub fn apply(doc: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!(
            "'{path}' is not a key path like 'topology.links.p1.delay_ms'"
        ));
    }
    let mut node = doc;
    for (i, part) in parts[..parts.len() - 1].iter().enumerate() {
        let here = parts[..=i].join(".");
        let next = node
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = match next {
            toml::Value::Table(t) => t,
            toml::Value::Array(items) => {
                let key = parts[i + 1];
                let names: Vec<String> = items
                    .iter()
                    .filter_map(|v| v.get("name")?.as_str().map(str::to_string))
                    .collect();
                let pos = element(items, key).ok_or_else(|| {
                    format!(
                        "'{path}': '{here}' has no element named '{key}' (it has: {})",
                        names.join(", ")
                    )
                })?;
                if i + 2 == parts.len() {
                    // The path ends at the element itself: merge or replace it.
                    return set(&mut items[pos], value, path);
                }
                let toml::Value::Table(t) = &mut items[pos] else {
                    return Err(format!("'{path}': '{here}.{key}' is not a table"));
                };
                // Skip the element name: the loop's next part is consumed here.
                return apply(t, &parts[i + 2..].join("."), value);
            }
            _ => return Err(format!("'{path}': '{here}' is a value, not a table")),
        };
    }
    let leaf = parts[parts.len() - 1];
    match node.get_mut(leaf) {
        Some(old) => set(old, value, path),
        None => {
            node.insert(leaf.to_string(), value);
            Ok(())
        }
    }
}

fn set(old: &mut toml::Value, value: toml::Value, path: &str) -> Result<(), String> {
    match (old, value) {
        (toml::Value::Table(o), toml::Value::Table(n)) => {
            for (k, v) in n {
                apply(o, &k, v).map_err(|e| format!("{path}: {e}"))?;
            }
            Ok(())
        }
        // A table of named elements merges into an array of tables (a TOML dotted key such as
        // `links.p1.delay_ms = 5` arrives as nested tables).
        (toml::Value::Array(items), toml::Value::Table(n)) => {
            for (k, v) in n {
                let pos = element(items, &k)
                    .ok_or_else(|| format!("'{path}' has no element named '{k}'"))?;
                set(&mut items[pos], v, &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        (old, value) => {
            *old = value;
            Ok(())
        }
    }
}

/// The position of the element called `key` (by its `name`, else a position).
fn element(items: &[toml::Value], key: &str) -> Option<usize> {
    items
        .iter()
        .position(|v| v.get("name").and_then(|n| n.as_str()) == Some(key))
        .or_else(|| key.parse::<usize>().ok().filter(|&k| k < items.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> toml::Table {
        toml::from_str(
            r#"
            a = 1
            [[links]]
            name = "p1"
            delay_ms = 10
            loss = { kind = "bernoulli", p = 0.1 }
            [[links]]
            name = "p2"
            delay_ms = 20
            "#,
        )
        .unwrap()
    }

    #[test]
    fn walks_tables_and_named_elements() {
        let mut d = doc();
        apply(&mut d, "links.p2.delay_ms", 5.into()).unwrap();
        apply(&mut d, "links.0.rate_mbps", 7.into()).unwrap();
        apply(&mut d, "x.y.z", true.into()).unwrap();
        let set: toml::Table = toml::from_str("links.p1.loss = { p = 0.2 }").unwrap();
        apply_table(&mut d, &set).unwrap();
        assert_eq!(d["links"][1]["delay_ms"].as_integer(), Some(5));
        assert_eq!(d["links"][0]["rate_mbps"].as_integer(), Some(7));
        assert_eq!(d["links"][0]["loss"]["p"].as_float(), Some(0.2));
        assert_eq!(d["links"][0]["loss"]["kind"].as_str(), Some("bernoulli"));
        assert_eq!(d["x"]["y"]["z"].as_bool(), Some(true));
    }

    #[test]
    fn errors_name_the_path() {
        let mut d = doc();
        let e = apply(&mut d, "links.p9.delay_ms", 1.into()).unwrap_err();
        assert!(
            e.contains("no element named 'p9'") && e.contains("p1, p2"),
            "{e}"
        );
        let e = apply(&mut d, "a.b", 1.into()).unwrap_err();
        assert!(e.contains("'a' is a value"), "{e}");
        assert!(apply(&mut d, "a..b", 1.into()).is_err());
    }
}
