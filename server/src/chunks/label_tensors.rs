//! The tensors an operator says are label images (`--label-tensors`): their chunks go
//! compressed to peers off loopback under `--wire-compression auto`, like label set
//! uploads (docs/decisions/0039). A pattern is matched against the whole array id: `*`
//! stands for any run of characters (`/` included), `?` for one character, anything else
//! for itself. Only integer tensors count; a float or bool tensor a pattern names stays
//! pixels.

/// Why a `--label-tensors` pattern is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LabelPatternError {
    /// The pattern is empty.
    #[error("an empty --label-tensors pattern names no tensor")]
    Empty,
}

/// The operator's patterns of label tensor ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelTensors {
    patterns: Vec<String>,
}

impl LabelTensors {
    /// The patterns, refusing an empty one.
    pub fn new(patterns: &[String]) -> Result<Self, LabelPatternError> {
        if patterns.iter().any(|p| p.is_empty()) {
            return Err(LabelPatternError::Empty);
        }
        Ok(Self {
            patterns: patterns.to_vec(),
        })
    }

    /// Whether a pattern names `array_id`.
    pub fn names(&self, array_id: &str) -> bool {
        let id: Vec<char> = array_id.chars().collect();
        self.patterns.iter().any(|pattern| {
            let pattern: Vec<char> = pattern.chars().collect();
            matches(&pattern, &id)
        })
    }
}

/// Whether `pattern` matches all of `text`: the greedy two-pointer walk with one star to
/// return to (linear in practice, never exponential).
fn matches(pattern: &[char], text: &[char]) -> bool {
    let (mut p, mut t) = (0, 0);
    // The last star seen, and where in the text it was tried.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                // Let the star swallow one more character and retry.
                Some((sp, st)) => {
                    star = Some((sp, st + 1));
                    p = sp + 1;
                    t = st + 1;
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn labels(patterns: &[&str]) -> LabelTensors {
        LabelTensors::new(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn patterns_name_whole_ids() {
        let l = labels(&["cells_seg", "exp/*_labels", "nuc??"]);
        assert!(l.names("cells_seg"));
        assert!(!l.names("cells_seg2"));
        assert!(!l.names("xcells_seg"));
        assert!(l.names("exp/a_labels"));
        assert!(l.names("exp/a/b_labels"));
        assert!(l.names("exp/_labels"));
        assert!(!l.names("exp/a_labels.1"));
        assert!(l.names("nuc01"));
        assert!(!l.names("nuc1"));
        assert!(labels(&["*"]).names("anything/at/all"));
        assert!(labels(&["a*b*c"]).names("aXbYbZc"));
        assert!(!labels(&["a*b*c"]).names("aXbYbZ"));
        assert!(!LabelTensors::default().names("cells_seg"));
        assert!(labels(&["**"]).names(""));
    }

    #[test]
    fn an_empty_pattern_is_refused() {
        assert_eq!(
            LabelTensors::new(&["a".into(), String::new()]),
            Err(LabelPatternError::Empty)
        );
    }
}
