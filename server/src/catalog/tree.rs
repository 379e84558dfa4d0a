//! One level of the catalog tree: what the `catalog_children` action answers.
//!
//! A source's place in the tree is its url read as a path: a configured source at
//! `/data/lab/a.npy` is `a.npy` in folder `data/lab`; a runtime source `dnd://drop/sub/b.npy`
//! is `b.npy` in folder `drop/sub`. A chain of folders with one child each is one folder
//! (`data/lab`), ending where a source sits or the chain forks. Folders come first and
//! share the limit with the sources; both are in byte order of name.
//!
//! The index is built once per registry generation: every source as `(dir, name, id)`,
//! its folder's segments joined by `\x01` (which no segment contains, so byte order of the
//! joined strings is the order of their segments), sorted. A level is then a range of that
//! sorted list; each folder of the level is found with one binary search past the one
//! before it, so a level costs `O(children · log n)`, not `O(n)`.

use serde::Serialize;

use std::path::Path;

use crate::source::origin::Origin;
use crate::source::registry::Registry;

/// Separator of the segments of a stored folder.
const SEP: char = '\x01';
/// The character after [`SEP`]: `dir < prefix + NEXT` bounds everything under `prefix`.
const NEXT: char = '\x02';

/// The `limit` a request without one gets.
pub const DEFAULT_LIMIT: usize = 2000;
/// The largest `limit` honoured; a larger one is this.
pub const MAX_LIMIT: usize = 100_000;

/// One source in the index.
#[derive(Debug)]
struct Entry {
    dir: String,
    name: String,
    source_id: String,
}

/// Every visible source by folder, sorted for range lookups.
#[derive(Debug, Default)]
pub struct TreeIndex {
    entries: Vec<Entry>,
}

/// A folder of a level.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct Folder {
    /// Its name under the level: one segment, or a chain `a/b` of single-child folders.
    pub name: String,
    /// The key to ask for its own level.
    pub key: String,
}

/// A source sitting directly in a level's folder.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct Leaf {
    /// The last segment of its url.
    pub name: String,
    /// Its id (its row is one `sources` query away).
    pub source_id: String,
}

/// The answer of `catalog_children`.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct Level {
    /// The folder asked for (`""`: the top).
    pub key: String,
    /// Folders directly under it, in byte order of name.
    pub folders: Vec<Folder>,
    /// Sources directly in it, in byte order of name.
    pub sources: Vec<Leaf>,
    /// Whether the limit cut the level.
    pub truncated: bool,
}

impl TreeIndex {
    /// The index of `sources`: each source's url path segments (folders then its own name)
    /// and its id. A source with no segment sits at the top, named by its id.
    pub fn build(sources: impl IntoIterator<Item = (Vec<String>, String)>) -> TreeIndex {
        Self::sorted(
            sources
                .into_iter()
                .map(|(mut parts, source_id)| {
                    parts.retain(|p| !p.is_empty());
                    let name = parts.pop().unwrap_or_else(|| source_id.clone());
                    Entry {
                        dir: parts.join(&SEP.to_string()),
                        name,
                        source_id,
                    }
                })
                .collect(),
        )
    }

    fn sorted(mut entries: Vec<Entry>) -> TreeIndex {
        entries.sort_unstable_by(|a, b| {
            (a.dir.as_str(), a.name.as_str(), a.source_id.as_str()).cmp(&(
                b.dir.as_str(),
                b.name.as_str(),
                b.source_id.as_str(),
            ))
        });
        TreeIndex { entries }
    }

    /// The index of every source of `registry`, served or refused.
    pub fn of(registry: &Registry) -> TreeIndex {
        let entries = registry
            .tensors()
            .map(|t| entry(&t.origin, t.source.path(), &t.source_id))
            .chain(
                registry
                    .refused()
                    .map(|r| entry(&r.origin, &r.path, &r.source_id)),
            )
            .collect();
        Self::sorted(entries)
    }

    /// How many sources the index holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the index holds no source.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// First entry whose folder is not below `bound` in byte order.
    fn first_at(&self, bound: &str) -> usize {
        self.entries.partition_point(|e| e.dir.as_str() < bound)
    }

    /// The level under folder `key` (`/`-joined names, `""` the top), at most `limit`
    /// folders and sources together (clamped to [`MAX_LIMIT`]).
    pub fn children(&self, key: &str, limit: usize) -> Level {
        let limit = limit.clamp(1, MAX_LIMIT);
        let here: String = key
            .split('/')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(&SEP.to_string());
        // The folder itself, then everything below it.
        let (start, end) = if here.is_empty() {
            (0, self.entries.len())
        } else {
            (
                self.first_at(&here),
                self.first_at(&format!("{here}{NEXT}")),
            )
        };
        let skip = if here.is_empty() { 0 } else { here.len() + 1 };
        let rest = |e: &Entry| -> String {
            if e.dir.len() <= skip {
                String::new()
            } else {
                e.dir[skip..].to_string()
            }
        };

        // Sources sitting directly here come first in the range (their dir is `here`).
        let direct_end = start + self.entries[start..end].partition_point(|e| e.dir == here);
        let mut folders = Vec::new();
        let mut truncated = false;
        let mut at = direct_end;
        while at < end {
            if folders.len() == limit {
                truncated = true;
                break;
            }
            let lo = rest(&self.entries[at]);
            let segment = lo.split(SEP).next().unwrap_or_default().to_string();
            let group_prefix = if here.is_empty() {
                segment.clone()
            } else {
                format!("{here}{SEP}{segment}")
            };
            let group_end = self.first_at(&format!("{group_prefix}{NEXT}")).min(end);
            let hi = rest(&self.entries[group_end - 1]);
            let chain: Vec<&str> = lo
                .split(SEP)
                .zip(hi.split(SEP))
                .take_while(|(x, y)| x == y)
                .map(|(x, _)| x)
                .collect();
            let name = chain.join("/");
            let key = if key.is_empty() || here.is_empty() {
                name.clone()
            } else {
                format!("{}/{name}", here.replace(SEP, "/"))
            };
            folders.push(Folder { name, key });
            at = group_end;
        }
        folders.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));

        let mut sources = Vec::new();
        if !truncated {
            let budget = limit - folders.len();
            let direct = &self.entries[start..direct_end];
            truncated = direct.len() > budget;
            sources = direct
                .iter()
                .take(budget)
                .map(|e| Leaf {
                    name: e.name.clone(),
                    source_id: e.source_id.clone(),
                })
                .collect();
        }
        Level {
            key: key.to_string(),
            folders,
            sources,
            truncated,
        }
    }
}

/// The entry of the source `source_id` at `path`: for a configured file its folder is its
/// parent directory, spelled with [`SEP`] in one pass.
fn entry(origin: &Origin, path: &Path, source_id: &str) -> Entry {
    let (Origin::Configured, Some(parent), Some(name)) = (origin, path.parent(), path.file_name())
    else {
        let mut parts = origin.tree_parts(path);
        parts.retain(|p| !p.is_empty());
        let name = parts.pop().unwrap_or_else(|| source_id.to_string());
        return Entry {
            dir: parts.join(&SEP.to_string()),
            name,
            source_id: source_id.to_string(),
        };
    };
    let parent = parent.to_string_lossy();
    let dir: String = parent
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(&SEP.to_string());
    Entry {
        dir,
        name: name.to_string_lossy().into_owned(),
        source_id: source_id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(urls: &[(&str, &str)]) -> TreeIndex {
        TreeIndex::build(urls.iter().map(|(path, id)| {
            (
                path.split('/').map(str::to_string).collect(),
                id.to_string(),
            )
        }))
    }

    fn names(level: &Level) -> (Vec<&str>, Vec<&str>) {
        (
            level.folders.iter().map(|f| f.name.as_str()).collect(),
            level.sources.iter().map(|s| s.name.as_str()).collect(),
        )
    }

    #[test]
    fn single_child_chains_are_one_folder() {
        let tree = index(&[
            ("/data/lab/plate/a.npy", "a"),
            ("/data/lab/plate/b.npy", "b"),
            ("/data/lab/other/c.npy", "c"),
        ]);
        let top = tree.children("", 100);
        assert_eq!(names(&top), (vec!["data/lab"], vec![]));
        assert_eq!(top.folders[0].key, "data/lab");
        let lab = tree.children("data/lab", 100);
        assert_eq!(names(&lab), (vec!["other", "plate"], vec![]));
        assert_eq!(lab.folders[1].key, "data/lab/plate");
        let plate = tree.children("data/lab/plate", 100);
        assert_eq!(names(&plate), (vec![], vec!["a.npy", "b.npy"]));
        assert_eq!(plate.sources[1].source_id, "b");
        assert!(!plate.truncated);
    }

    #[test]
    fn a_chain_stops_where_a_source_sits() {
        let tree = index(&[("/d/x.npy", "x"), ("/d/e/f/y.npy", "y")]);
        assert_eq!(names(&tree.children("", 10)), (vec!["d"], vec![]));
        assert_eq!(names(&tree.children("d", 10)), (vec!["e/f"], vec!["x.npy"]));
        assert_eq!(
            tree.children("d", 10).folders[0].key,
            "d/e/f",
            "a chained folder's key is its full path"
        );
    }

    #[test]
    fn names_sort_by_bytes_and_prefix_siblings_stay_apart() {
        let tree = index(&[
            ("/r/a/1.npy", "1"),
            ("/r/a/2.npy", "2"),
            ("/r/a-b/3.npy", "3"),
            ("/r/a-b/4.npy", "4"),
            ("/r/B.npy", "B"),
        ]);
        let level = tree.children("r", 10);
        assert_eq!(names(&level), (vec!["a", "a-b"], vec!["B.npy"]));
        assert_eq!(names(&tree.children("r/a", 10)).1, vec!["1.npy", "2.npy"]);
        assert!(tree.children("r/a/1.npy", 10).sources.is_empty());
        assert!(tree.children("nowhere", 10).folders.is_empty());
    }

    #[test]
    fn limit_cuts_folders_first_and_says_so() {
        let tree = index(&[
            ("/t/a/x.npy", "1"),
            ("/t/b/x.npy", "2"),
            ("/t/c.npy", "3"),
            ("/t/d.npy", "4"),
        ]);
        let level = tree.children("t", 3);
        assert_eq!(names(&level), (vec!["a", "b"], vec!["c.npy"]));
        assert!(level.truncated);
        let level = tree.children("t", 1);
        assert_eq!(names(&level), (vec!["a"], vec![]));
        assert!(level.truncated);
        assert!(!tree.children("t", 4).truncated);
        assert_eq!(
            tree.children("t", 0).folders.len(),
            1,
            "limit is at least 1"
        );
    }

    #[test]
    fn a_source_without_a_path_sits_at_the_top_by_id() {
        let tree = index(&[("", "lonely")]);
        let top = tree.children("", 5);
        assert_eq!(names(&top), (vec![], vec!["lonely"]));
    }
}
