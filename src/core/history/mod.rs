//! Change history per key, for flows that need more than the winning change:
//! SCD Type 2 (every version of a row, with `__START_AT` / `__END_AT`) and
//! `ignore_null_updates` (a null keeps the column's value).
//!
//! Per key the state keeps the applied changes ("events") in sequence order.
//! The rows a key has in the target are a pure function of its events
//! (`fold`), so a late event is simply put in its place and the key folded
//! again: the output rows that changed are removed (by position, which each
//! row's anchor event records) and the new ones inserted. Whatever the
//! arrival order and batching, the target equals the fold of all events.
//!
//! Every event is kept: SCD Type 2's history can be split anywhere later,
//! and under `ignore_null_updates` a late change may fill a column of any
//! earlier version. SCD Type 1 with ties rejected drops the values of
//! upserts that later ones overwrite entirely, keeping their sequence and
//! fingerprint (see `prune`).
//!
//! Architecture invariant: no I/O, no clock (commit time is a parameter).
//!
//! The files, one idea each:
//! - `vals`: a change's encoded values in one allocation (`Vals`, LEB128).
//! - `event`: one applied change of a key in one allocation (`Event`).
//! - `arena`: every key's events (`History`: slots, index, dirty list,
//!   counts, tombstone collection).
//! - `fold`: the semantics (`HistCodec`, `Folding`, `fold`, `prune`,
//!   `refold_from`); changing SCD Type 2 semantics is editing this file.
//! - `resolve`: a batch against the history (`resolve`, `place_rows`, `seek`).
//! - `plan`: what a batch does (`Plan`) and its rows as a batch (`rows_batch`).
//! - `refold`: keys folded again (`rewrite_rows`, `refold`, `rebuild`).
//! - `apply`: the history moved forward by a plan (`apply`).

mod apply;
mod arena;
mod event;
mod fold;
mod plan;
mod refold;
mod resolve;
mod vals;

pub use apply::apply;
pub use arena::History;
pub use event::Event;
pub use fold::{Cut, End, Folding, HistCodec, Version, fold};
pub use plan::{KeyChange, OutRow, Plan, rows_batch};
pub use refold::{rebuild, refold};
pub use resolve::resolve;
pub use vals::{Vals, ValsRef};
