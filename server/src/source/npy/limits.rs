//! Bounds applied to every `.npy` source before anything is allocated or mapped.

/// Bounds on what a `.npy` source may declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest header accepted, in bytes (default 65,536). Checked before the header is read.
    pub max_header_len: usize,
    /// Most elements an array may hold (default 2^40).
    pub max_elements: u64,
    /// Largest payload in bytes (default 1 TiB).
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_len: 65_536,
            max_elements: 1 << 40,
            max_bytes: 1 << 40,
        }
    }
}

impl Limits {
    /// Sets [`Limits::max_header_len`].
    pub fn with_max_header_len(mut self, bytes: usize) -> Self {
        self.max_header_len = bytes;
        self
    }

    /// Sets [`Limits::max_elements`].
    pub fn with_max_elements(mut self, elements: u64) -> Self {
        self.max_elements = elements;
        self
    }

    /// Sets [`Limits::max_bytes`].
    pub fn with_max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }
}
