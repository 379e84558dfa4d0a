//! What the manifest keeps about one upload, and its status ladder:
//! `PENDING → READY`, and `→ DISCARDED` from either; never back down.

use serde::{Deserialize, Serialize};

/// Where an upload stands (biopb `UploadStatus.State`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// Taking chunks; not readable.
    Pending,
    /// Published and sealed: readable, takes no more chunks.
    Ready,
    /// Given up on (by its producer or its deadline); terminal.
    Discarded,
}

impl State {
    /// The wire enum value (`UploadStatus.State`).
    pub fn wire(self) -> i32 {
        match self {
            State::Pending => 1,
            State::Ready => 2,
            State::Discarded => 3,
        }
    }

    /// The state a wire enum value names (`None` for `STATE_UNSPECIFIED` and unknown values).
    pub fn from_wire(value: i32) -> Option<State> {
        match value {
            1 => Some(State::Pending),
            2 => Some(State::Ready),
            3 => Some(State::Discarded),
            _ => None,
        }
    }

    /// The name the protocol spells it with.
    pub fn name(self) -> &'static str {
        match self {
            State::Pending => "PENDING",
            State::Ready => "READY",
            State::Discarded => "DISCARDED",
        }
    }

    fn rung(self) -> u8 {
        match self {
            State::Pending => 0,
            State::Ready => 1,
            State::Discarded => 2,
        }
    }
}

/// How an upload's bytes are kept, as its `add_tensor` scheme said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreFormat {
    /// `cache://`: in its segment store only.
    #[default]
    Cache,
    /// `zarr://`: in its segment store and, as well, a Zarr v2 store a user can take away
    /// (docs/decisions/0031).
    Zarr,
}

/// What a requested move does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// Already there: nothing changes.
    Stay,
    /// Up the ladder.
    To(State),
}

/// Why a move is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The upload is discarded; nothing moves it again.
    Discarded,
    /// A move down the ladder (READY to PENDING).
    Backwards {
        /// The current state.
        from: State,
    },
}

/// The ladder: what moving from `from` to `to` does, or why it is refused.
pub fn transition(from: State, to: State) -> Result<Move, Refusal> {
    if from == to {
        return Ok(Move::Stay);
    }
    if from == State::Discarded {
        return Err(Refusal::Discarded);
    }
    if to.rung() < from.rung() {
        return Err(Refusal::Backwards { from });
    }
    Ok(Move::To(to))
}

/// One upload as the manifest keeps it (JSON in the `uploads` table, keyed by array id).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UploadRecord {
    /// `<source_id>/@fields/<name>`.
    pub array_id: String,
    /// Unique across the state directory's life: names the data directory and is part of
    /// the tensor's content version, so a name used again gets new chunk ids.
    pub uid: u64,
    /// The tensor's shape.
    pub shape: Vec<u64>,
    /// The numpy dtype string.
    pub dtype: String,
    /// The server's grid for it: every chunk is one cell.
    pub chunk_shape: Vec<u64>,
    /// Axis labels.
    pub dim_labels: Vec<String>,
    /// Where it stands.
    pub state: State,
    /// Why it was discarded; empty otherwise.
    pub reason: String,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_ns: i64,
    /// The granted lifetime, if any.
    pub ttl_seconds: Option<u32>,
    /// Unix seconds after which it is discarded (wall clock, so it keeps counting while
    /// the server is down).
    pub expires_at: Option<u64>,
    /// Unix seconds at which it was discarded.
    pub discarded_at: Option<u64>,
    /// How its bytes are kept (absent from records written before Zarr uploads: `cache`).
    #[serde(default)]
    pub format: StoreFormat,
}

impl UploadRecord {
    /// Unix seconds after which a discarded upload's name is free again: its granted
    /// lifetime after the discard, at most `max_secs` (`max_secs` when it had none).
    pub fn tombstone_until(&self, max_secs: u64) -> Option<u64> {
        let at = self.discarded_at?;
        let lasts = self
            .ttl_seconds
            .map_or(max_secs, |t| u64::from(t).min(max_secs));
        Some(at.saturating_add(lasts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_goes_up_stays_put_and_never_back() {
        use State::*;
        assert_eq!(transition(Pending, Ready), Ok(Move::To(Ready)));
        assert_eq!(transition(Pending, Discarded), Ok(Move::To(Discarded)));
        assert_eq!(transition(Ready, Discarded), Ok(Move::To(Discarded)));
        for s in [Pending, Ready, Discarded] {
            assert_eq!(transition(s, s), Ok(Move::Stay));
        }
        assert_eq!(
            transition(Ready, Pending),
            Err(Refusal::Backwards { from: Ready })
        );
        assert_eq!(transition(Discarded, Ready), Err(Refusal::Discarded));
        assert_eq!(transition(Discarded, Pending), Err(Refusal::Discarded));
    }

    #[test]
    fn wire_values_round_trip_and_unspecified_is_none() {
        for s in [State::Pending, State::Ready, State::Discarded] {
            assert_eq!(State::from_wire(s.wire()), Some(s));
        }
        assert_eq!(State::from_wire(0), None);
        assert_eq!(State::from_wire(9), None);
    }
}
