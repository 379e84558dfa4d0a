//! The ids given to files: once given, an id stays with its file and is never given to
//! another (annotations and clients follow ids).
//!
//! Ids are derived from paths (docs: the id rule in [`super::registry`]); two paths can
//! derive the same id (`a b.npy` and `a_b.npy` both make `a_b`). The first file to get an id
//! keeps it; a later file with the same derived id gets the next free `-N` suffix, whatever
//! the order the files are listed or added in afterwards, for as long as the first file
//! exists (an id whose file is gone is free again). With a state directory the book is
//! kept on disk (`source_ids`, one JSON line per id given) so ids survive a restart; without
//! one it lives as long as the process.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::source::registry::Candidate;

/// One line of the book on disk.
#[derive(Debug, Serialize, Deserialize)]
struct Given {
    id: String,
    path: PathBuf,
}

/// Ids given, by path and by id.
#[derive(Debug, Default)]
pub struct IdBook {
    by_path: HashMap<PathBuf, String>,
    by_id: HashMap<String, PathBuf>,
    /// Where new ids are appended, when the book is kept on disk.
    file: Option<PathBuf>,
    /// Ids given since the last [`IdBook::flush`], not yet on disk.
    pending: Vec<Given>,
}

impl IdBook {
    /// The book kept in `file`, with the ids it already holds (a torn last line, from a
    /// crash mid-write, is skipped).
    pub fn load(file: &Path) -> std::io::Result<IdBook> {
        let mut book = IdBook {
            file: Some(file.to_path_buf()),
            ..IdBook::default()
        };
        let text = match std::fs::File::open(file) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(book),
            Err(err) => return Err(err),
        };
        for line in std::io::BufReader::new(text).lines() {
            // An id whose file is gone is free again: its file cannot come back under
            // another name, and a folder moved elsewhere keeps its ids.
            if let Ok(given) = serde_json::from_str::<Given>(&line?)
                && given.path.exists()
            {
                book.note(given.id, given.path);
            }
        }
        Ok(book)
    }

    /// The ids of `candidates`, in their order: each path keeps the id it was given, new
    /// paths get their derived id or the next free suffix of it.
    pub(crate) fn assign_all(&mut self, candidates: &[Candidate]) -> Vec<String> {
        let mut taken: HashSet<String> = HashSet::new();
        let mut ids: Vec<Option<String>> = candidates
            .iter()
            .map(|c| {
                let id = self
                    .by_path
                    .get(&c.path)
                    .filter(|id| !taken.contains(*id))?;
                taken.insert(id.clone());
                Some(id.clone())
            })
            .collect();
        for (candidate, id) in candidates.iter().zip(ids.iter_mut()) {
            if id.is_none() {
                *id = Some(self.assign(&candidate.base, &candidate.path, |id| taken.contains(id)));
                if let Some(id) = id {
                    taken.insert(id.clone());
                }
            }
        }
        ids.into_iter().map(Option::unwrap_or_default).collect()
    }

    /// The id of the file at `path` derived as `base`: the one it was given, unless
    /// `in_use` says another entry holds it now; else `base` or its next free suffix, never
    /// one given to another path.
    pub fn assign(&mut self, base: &str, path: &Path, in_use: impl Fn(&str) -> bool) -> String {
        if let Some(id) = self.by_path.get(path).filter(|id| !in_use(id)) {
            return id.clone();
        }
        let mut id = base.to_string();
        let mut n = 1;
        while in_use(&id) || self.by_id.get(&id).is_some_and(|p| p != path && p.exists()) {
            n += 1;
            id = format!("{base}-{n}");
        }
        if !self.by_path.contains_key(path) {
            self.note(id.clone(), path.to_path_buf());
            self.pending.push(Given {
                id: id.clone(),
                path: path.to_path_buf(),
            });
        }
        id
    }

    fn note(&mut self, id: String, path: PathBuf) {
        self.by_id.insert(id.clone(), path.clone());
        self.by_path.insert(path, id);
    }

    /// Appends the ids given since the last flush to the book's file (called with no
    /// registry lock held: it is file I/O); a failure is logged (those ids hold until the
    /// process ends).
    pub fn flush(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let Some(file) = &self.file else {
            return;
        };
        if pending.is_empty() {
            return;
        }
        let mut text = String::new();
        for given in &pending {
            if let Ok(line) = serde_json::to_string(given) {
                text.push_str(&line);
                text.push('\n');
            }
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(err) = written {
            tracing::warn!(file = %file.display(), ids = pending.len(), error = %err, "source ids not recorded; they hold until the server stops");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_stay_with_their_files_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("source_ids");
        let first = dir.path().join("a_b.npy");
        let second = dir.path().join("a b.npy");
        std::fs::write(&first, b"").unwrap();
        std::fs::write(&second, b"").unwrap();
        let mut book = IdBook::load(&file).unwrap();
        let never = |_: &str| false;
        assert_eq!(book.assign("a_b", &first, never), "a_b");
        book.flush();
        let mut book = IdBook::load(&file).unwrap();
        assert_eq!(book.assign("a_b", &second, never), "a_b-2");
        assert_eq!(book.assign("a_b", &first, never), "a_b");
        // Once its file is gone, an id is free again (after a restart too).
        book.flush();
        std::fs::remove_file(&first).unwrap();
        let third = dir.path().join("a-b.npy");
        std::fs::write(&third, b"").unwrap();
        let mut book = IdBook::load(&file).unwrap();
        assert_eq!(book.assign("a_b", &third, never), "a_b");
    }
}
