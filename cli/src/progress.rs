//! The one progress line the commands draw on stderr while they work, when it is a terminal.

use std::io::{IsTerminal, Write as _};
use std::time::{Duration, Instant};

/// Least time between two redraws (the last one is always drawn).
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// `LABEL:  42% (21/50 chunks, DETAIL)`, redrawn in place.
pub struct Progress {
    label: String,
    total: usize,
    drawn: Option<Instant>,
    enabled: bool,
}

impl Progress {
    /// A line for `total` chunks, drawn only when stderr is a terminal.
    pub fn new(label: impl Into<String>, total: usize) -> Self {
        Self {
            label: label.into(),
            total,
            drawn: None,
            enabled: std::io::stderr().is_terminal(),
        }
    }

    /// Redraws the line for `done` chunks, with `detail` (e.g. bytes so far) after the count.
    pub fn update(&mut self, done: usize, detail: &str) {
        let finished = done >= self.total;
        if !self.enabled || (!finished && self.drawn.is_some_and(|t| t.elapsed() < REDRAW_EVERY)) {
            return;
        }
        self.drawn = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{}", line(&self.label, done, self.total, detail));
        let _ = err.flush();
    }

    /// Ends the line, if one was drawn.
    pub fn finish(&self) {
        if self.drawn.is_some() {
            eprintln!();
        }
    }
}

fn line(label: &str, done: usize, total: usize, detail: &str) -> String {
    let percent = (done * 100).checked_div(total).unwrap_or(100);
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(", {detail}")
    };
    format!("{label}: {percent:3}% ({done}/{total} chunks{detail}) ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_chunks() {
        assert_eq!(line("img", 1, 4, ""), "img:  25% (1/4 chunks) ");
        assert_eq!(
            line("warm", 2, 2, "3.0 MiB"),
            "warm: 100% (2/2 chunks, 3.0 MiB) "
        );
        assert_eq!(line("empty", 0, 0, ""), "empty: 100% (0/0 chunks) ");
    }
}
