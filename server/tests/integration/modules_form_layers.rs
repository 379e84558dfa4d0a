//! The layering ARCHITECTURE.md draws holds in the code: no module of the server calls back
//! into a module that uses it (the segment store has its own such test), and the read path below the wire
//! (sources, grid, chunks) names no gRPC crate. A path `crate::a::…` written in a module
//! `b` is an edge `b → a`; a cycle among the edges fails the test and names its modules.
//! Unit-test modules (`#[cfg(test)] mod tests`) are left out, as a test may reach anywhere,
//! and so are comments: a doc link is not a use.

#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Modules below the wire: they must not know the wire's crates.
const BELOW_THE_WIRE: &[&str] = &["source", "grid", "chunks"];
const WIRE_CRATES: &[&str] = &["tonic::", "arrow_flight::"];

type Graph = BTreeMap<String, BTreeSet<String>>;

fn crate_src(crate_dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read the source folder") {
        let path = entry.expect("read a folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`lib` for the crate root).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("file under src");
    let first = rel.components().next().expect("a path component");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_string()
}

/// The file's code: its unit-test module and its comments (doc links are not uses) left out.
fn code_of(text: &str) -> String {
    let code = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    code.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of every `crate::segment` path in `code`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `tessera_segments::crate_…` or similar, not a path of ours
        }
        let name: String = code[at + "crate::".len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
            found.insert(name);
        }
    }
    found
}

fn module_graph(crate_dir: &str) -> (Graph, BTreeMap<String, String>) {
    let src = crate_src(crate_dir);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph = Graph::new();
    let mut code_by_module: BTreeMap<String, String> = BTreeMap::new();
    for file in files {
        let module = module_of(&src, &file);
        let text = fs::read_to_string(&file).expect("read a source file");
        let code = code_of(&text);
        let code = code.as_str();
        let targets = graph.entry(module.clone()).or_default();
        for target in crate_paths(code) {
            if target != module {
                targets.insert(target);
            }
        }
        code_by_module.entry(module).or_default().push_str(code);
    }
    graph.remove("lib");
    for targets in graph.values_mut() {
        targets.remove("lib");
    }
    (graph, code_by_module)
}

/// A cycle of the graph, as the modules along it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

fn render(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(module, uses)| {
            let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
            format!("  {module} → {}\n", uses.join(", "))
        })
        .collect()
}

#[test]
fn server_modules_form_layers() {
    let (graph, _) = module_graph("server");
    assert!(
        graph.contains_key("source") && graph.contains_key("wire"),
        "{graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "server modules call back into a module that uses them: {}\nthe graph:\n{}",
            cycle.join(" → "),
            render(&graph)
        );
    }
}

#[test]
fn the_read_path_below_the_wire_names_no_grpc_crate() {
    let (_, code) = module_graph("server");
    for module in BELOW_THE_WIRE {
        let text = code.get(*module).expect("a module below the wire");
        for wire in WIRE_CRATES {
            assert!(
                !text.contains(wire),
                "server module `{module}` names `{wire}`"
            );
        }
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let mut graph = Graph::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    graph.entry("c".into()).or_default().insert("a".into());
    let cycle = find_cycle(&graph).expect("a → b → c → a is a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
    graph.get_mut("c").expect("c").clear();
    assert_eq!(find_cycle(&graph), None);
}
