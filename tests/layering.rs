//! The module graph of `src/`, read from its `use` paths: no module
//! depends on itself through others, the wire (`pg`) depends on nothing
//! above it, the shared words (`model`) on nothing, the lake not on the
//! wire, the pipeline on it only through `cdc`, the settings not on the
//! pipeline, and nothing but the commands
//! (`ops`) and the binary depends on the commands (docs/architecture.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module of the crate by path (`cdc::event`), with its source
/// outside comments and its unit tests.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&root).unwrap().with_extension("");
        let mut parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        if parts.last().is_some_and(|p| p == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code: String = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        modules.insert(parts.join("::"), code);
    }
    modules
}

/// The modules each module names through `crate::` or `super::` paths
/// (its own ancestors left out).
fn edges(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let resolve = |path: &str| {
        let mut parts: Vec<&str> = path.split("::").collect();
        while !parts.is_empty() {
            let candidate = parts.join("::");
            if modules.contains_key(&candidate) {
                return Some(candidate);
            }
            parts.pop();
        }
        None
    };
    let mut edges = BTreeMap::new();
    for (module, code) in modules {
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        let mut targets = BTreeSet::new();
        for (at, _) in code
            .match_indices("crate::")
            .chain(code.match_indices("super::"))
        {
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let full = match path.strip_prefix("super::") {
                Some(rest) if parent.is_empty() => rest.to_owned(),
                Some(rest) => format!("{parent}::{rest}"),
                None => path["crate::".len()..].to_owned(),
            };
            if let Some(target) = resolve(&full)
                && !target.is_empty()
                && target != *module
                && !module.starts_with(&format!("{target}::"))
            {
                targets.insert(target);
            }
        }
        edges.insert(module.clone(), targets);
    }
    edges
}

/// A cycle through `from`, if there is one.
fn cycle_through(edges: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_owned(), vec![from.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in edges.get(&at).into_iter().flatten() {
            if next == from {
                return Some([path.clone(), vec![from.to_owned()]].concat());
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
            }
        }
    }
    None
}

#[test]
fn no_module_depends_on_itself_the_wire_on_nothing_above_it_and_none_on_the_commands() {
    let modules = modules();
    let edges = edges(&modules);
    assert!(
        edges
            .get("ops::run")
            .is_some_and(|t| t.contains("apply::run")),
        "the scan reads use paths: {edges:?}"
    );
    for module in edges.keys() {
        if let Some(cycle) = cycle_through(&edges, module) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
    // What operators run sits on top: nothing below it uses it.
    for (module, targets) in edges.iter().filter(|(m, _)| !m.starts_with("ops")) {
        for target in targets {
            assert!(
                !target.starts_with("ops"),
                "{module} depends on {target}, a command"
            );
        }
    }
    let tops = |prefix: &'static str| {
        edges
            .iter()
            .filter(move |(m, _)| m.split("::").next() == Some(prefix))
            .flat_map(|(m, targets)| {
                targets
                    .iter()
                    .map(move |t| (m.clone(), t.split("::").next().unwrap().to_owned()))
            })
    };
    for (module, top) in tops("pg") {
        assert!(
            ["pg", "error", "metrics", "model"].contains(&top.as_str()),
            "{module} (the wire) depends on {top}"
        );
    }
    // The shared words sit below everything.
    for (module, top) in tops("model") {
        assert!(
            ["model", "error"].contains(&top.as_str()),
            "{module} (the shared words) depends on {top}"
        );
    }
    // The settings sit below the pipeline they configure: each default
    // lives beside its setting, and the pipeline reads it from there.
    for (module, top) in tops("config") {
        assert!(
            !["apply", "ops"].contains(&top.as_str()),
            "{module} (the settings) depends on {top}"
        );
    }
    // The lake knows Iceberg, not the wire it was fed from.
    for (module, top) in tops("lake") {
        assert_ne!(top, "pg", "{module} (the lake) depends on the wire");
    }
    // The pipeline reaches the source through the capture and the source
    // interface (`cdc::source`); of the wire it names only the
    // connection settings it hands them.
    for (module, targets) in edges.iter().filter(|(m, _)| m.starts_with("apply")) {
        for target in targets.iter().filter(|t| t.starts_with("pg")) {
            assert_eq!(
                target, "pg::config",
                "{module} (the pipeline) reaches the wire ({target}), not through cdc::source"
            );
        }
    }
}
