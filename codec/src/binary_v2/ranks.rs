//! Flag bit 2's workers section: the palette in order of first appearance and each
//! record's worker as a rank among the candidates for it (see the module docs above).

use super::MAX_RANKED_PALETTE;
use crate::wire::{put_column, put_varint};

/// Flag bit 2's workers section: the palette in order of first appearance, then the
/// ranks ([`Ranker`]), given each record's completion time as `put_times` stores it.
/// Returns the palette positions, or `None` for a palette too large to rank.
pub(super) fn put_ranked_workers(
    out: &mut Vec<u8>,
    workers: &[u32],
    completed: &[u64],
) -> Option<Vec<u64>> {
    let mut palette: Vec<u32> = Vec::new();
    let local: Vec<u64> = workers
        .iter()
        .map(|&w| match palette.iter().position(|&p| p == w) {
            Some(at) => at as u64,
            None => {
                palette.push(w);
                (palette.len() - 1) as u64
            }
        })
        .collect();
    if palette.len() > MAX_RANKED_PALETTE {
        return None;
    }
    put_varint(out, palette.len() as u64);
    for &w in &palette {
        put_varint(out, u64::from(w));
    }
    let mut ranker = Ranker::new(palette.len());
    let ranks: Vec<u64> = local
        .iter()
        .zip(completed)
        .map(|(&w, &done)| {
            let rank = ranker.rank_of(w as usize);
            ranker.done(w as usize, done);
            rank as u64
        })
        .collect();
    put_column(out, &ranks);
    Some(local)
}

/// The candidates for a batch's next record under flag bit 2: the next palette entry
/// not seen yet (the palette is in order of first appearance), then the workers seen,
/// by last completion, ties by position.
pub(super) struct Ranker {
    /// The workers seen so far as (last completion, palette position), in candidate
    /// order; at most 16, so kept sorted by insertion.
    order: Vec<(u64, usize)>,
    /// Palette entries, all of which get seen.
    palette: usize,
}

impl Ranker {
    pub(super) fn new(palette: usize) -> Self {
        Ranker {
            order: Vec::with_capacity(palette),
            palette,
        }
    }

    /// Whether a new worker is still a candidate (rank 0).
    fn new_pending(&self) -> bool {
        self.order.len() < self.palette
    }

    /// The rank of palette position `w`, which is seen or the next new one.
    pub(super) fn rank_of(&self, w: usize) -> usize {
        match self.order.iter().position(|&(_, j)| j == w) {
            None => 0,
            Some(at) => usize::from(self.new_pending()) + at,
        }
    }

    /// The palette position at `rank`, if there is one ([`Self::rank_of`]'s inverse).
    pub(super) fn worker_at(&self, rank: usize) -> Option<usize> {
        if self.new_pending() {
            match rank.checked_sub(1) {
                None => Some(self.order.len()),
                Some(r) => self.order.get(r).map(|&(_, j)| j),
            }
        } else {
            self.order.get(rank).map(|&(_, j)| j)
        }
    }

    /// Records that position `w` (seen, or the next new one) completed at `done`.
    pub(super) fn done(&mut self, w: usize, done: u64) {
        if let Some(at) = self.order.iter().position(|&(_, j)| j == w) {
            self.order.remove(at);
        }
        let key = (done, w);
        // Completions mostly grow: look from the end.
        let at = self
            .order
            .iter()
            .rposition(|&k| k < key)
            .map_or(0, |i| i + 1);
        self.order.insert(at, key);
    }
}
