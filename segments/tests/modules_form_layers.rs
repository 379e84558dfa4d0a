//! The store's modules form layers: no file of `src/` uses, directly or through others, a
//! module that uses it (docs/decisions/0026). A module "uses" another when it names it
//! (`crate::budget::…`) or reaches one of the shared owners through its field
//! (`shared.budget.…`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Fields through which a module reaches an owner, and the owner's module.
const OWNER_FIELDS: [(&str, &str); 6] = [
    (".budget.", "budget"),
    (".catalog.", "catalog"),
    (".health.", "health"),
    (".mailbox.", "mailbox"),
    (".maintenance.", "evict"),
    (".writer.", "append"),
];

/// The modules each file of `src/` uses (comments aside).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = std::fs::read_dir(src)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    let mut graph = BTreeMap::new();
    for module in modules.iter().filter(|m| *m != "lib") {
        let text = std::fs::read_to_string(src.join(format!("{module}.rs"))).unwrap();
        let mut uses = BTreeSet::new();
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
            for (_, rest) in line
                .match_indices("crate::")
                .map(|(i, _)| line.split_at(i + 7))
            {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                uses.insert(name);
            }
            for (field, owner) in OWNER_FIELDS {
                if line.contains(field) {
                    uses.insert(owner.to_string());
                }
            }
        }
        uses.retain(|u| u != module && modules.contains(u));
        graph.insert(module.clone(), uses);
    }
    graph
}

/// A cycle through `module`, if the walk from it finds one.
fn cycle_from(
    graph: &BTreeMap<String, BTreeSet<String>>,
    module: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|m| m == module) {
        let mut cycle = path[at..].to_vec();
        cycle.push(module.to_string());
        return Some(cycle);
    }
    if done.contains(module) {
        return None;
    }
    path.push(module.to_string());
    for used in graph.get(module).into_iter().flatten() {
        if let Some(cycle) = cycle_from(graph, used, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(module.to_string());
    None
}

#[test]
fn no_module_uses_one_that_uses_it() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        graph["store"].contains("append"),
        "the graph is read: {graph:?}"
    );
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, module, &mut Vec::new(), &mut done) {
            panic!("modules call back up: {}", cycle.join(" -> "));
        }
    }
}
