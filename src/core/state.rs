//! The per-key sequence state: for every key ever seen (until its tombstone
//! is collected), the winning sequence, a fingerprint of the winning change,
//! and either the live row's location (data file + position) or the
//! tombstone's commit time.
//!
//! In memory it is a compact open-addressing index over an arena of
//! row-encoded keys: about 47 bytes per key for one `long` key (see
//! `KeyIndex::bytes_per_key` and the benchmark). On disk it is the aux
//! Iceberg table `<table>__autocdc_state` (see `state_table`).
//!
//! Architecture invariant: this module does no I/O and reads no clock.

use std::sync::Arc;

use hashbrown::HashTable;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes in a slot for the key and the sequence.
const SLOT_DATA: usize = 20;
/// Inline capacity for a row-encoded sequence next to an arena key; longer ones spill.
const SEQ_INLINE: usize = SLOT_DATA - 4;

const F_TOMBSTONE: u8 = 1;
const F_HAS_LOC: u8 = 2;
const F_DIRTY: u8 = 4;
const F_SPILLED: u8 = 8;
const F_KEY_INLINE: u8 = 16;

/// Where a live row autocdc wrote sits: a data file (interned id) and its row position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    pub file: u32,
    pub pos: u32,
}

/// The value half of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A live row; `None` when its position is unknown (a row autocdc did not write).
    Live(Option<Loc>),
    /// A delete won; kept until `tombstone_gc_threshold` after `deleted_at_ms`.
    Tombstone { deleted_at_ms: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// Where the entry sits: a hint for `put` right after a lookup.
    pub slot: u32,
    pub key: &'a [u8],
    pub seq: &'a [u8],
    pub fingerprint: u64,
    pub value: Value,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    /// With `F_KEY_INLINE`: the key bytes, then the sequence bytes (one `long`
    /// key and one `long` sequence fit, so the common case needs no read
    /// of the key arena). Otherwise: the key's arena address in `[0..4]`, then the
    /// sequence inline in `[4..20]`, or its spill offset (u64) and length (u32).
    data: [u8; SLOT_DATA],
    key_len: u16,
    seq_len: u8,
    flags: u8,
    fingerprint: u64,
    /// `file << 32 | pos` for a live row with a location; the delete time for a tombstone.
    payload: u64,
}

/// Slots in fixed-size chunks: growth never copies or doubles the whole array,
/// so capacity stays within one chunk of the length.
const SLOT_CHUNK_SHIFT: u32 = 13;
const SLOT_CHUNK: usize = 1 << SLOT_CHUNK_SHIFT;

#[derive(Default, Clone)]
struct Slots {
    chunks: Vec<Vec<Slot>>,
    len: usize,
}

impl Slots {
    #[inline]
    fn get(&self, i: u32) -> &Slot {
        &self.chunks[(i >> SLOT_CHUNK_SHIFT) as usize][i as usize & (SLOT_CHUNK - 1)]
    }

    #[inline]
    fn get_mut(&mut self, i: u32) -> &mut Slot {
        &mut self.chunks[(i >> SLOT_CHUNK_SHIFT) as usize][i as usize & (SLOT_CHUNK - 1)]
    }

    fn push(&mut self, slot: Slot) -> u32 {
        if self.len.is_multiple_of(SLOT_CHUNK) {
            // Grows by doubling up to SLOT_CHUNK, so a small index stays small.
            self.chunks.push(Vec::new());
        }
        let i = u32::try_from(self.len).expect("more than 4 billion keys");
        self.chunks.last_mut().expect("a chunk").push(slot);
        self.len += 1;
        i
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> + '_ {
        self.chunks.iter().flatten()
    }

    fn bytes(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| c.capacity() * std::mem::size_of::<Slot>())
            .sum()
    }
}

/// Key bytes in 1 MiB chunks, addressed by `chunk << 20 | offset`.
const ARENA_CHUNK_SHIFT: u32 = 20;
const ARENA_CHUNK: usize = 1 << ARENA_CHUNK_SHIFT;

#[derive(Default, Clone)]
struct Arena {
    chunks: Vec<Vec<u8>>,
}

impl Arena {
    fn push(&mut self, bytes: &[u8]) -> u32 {
        debug_assert!(bytes.len() <= u16::MAX as usize);
        if self
            .chunks
            .last()
            .is_none_or(|c| c.len() + bytes.len() > ARENA_CHUNK)
        {
            assert!(
                self.chunks.len() < 1 << (32 - ARENA_CHUNK_SHIFT),
                "key arena above 4 GiB"
            );
            // Addresses are (chunk, offset), so a chunk may reallocate as it grows.
            self.chunks.push(Vec::new());
        }
        let c = self.chunks.len() - 1;
        let chunk = &mut self.chunks[c];
        let off = chunk.len();
        chunk.extend_from_slice(bytes);
        ((c as u32) << ARENA_CHUNK_SHIFT) | off as u32
    }

    #[inline]
    fn get(&self, at: u32, len: u16) -> &[u8] {
        let off = at as usize & (ARENA_CHUNK - 1);
        &self.chunks[(at >> ARENA_CHUNK_SHIFT) as usize][off..off + len as usize]
    }

    fn bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.capacity()).sum()
    }
}

/// Interned data file paths, so each key stores a 4-byte file id.
#[derive(Debug, Default, Clone)]
pub struct FileTable {
    paths: Vec<Arc<str>>,
    ids: hashbrown::HashMap<Arc<str>, u32>,
    /// Files another writer removed from the target (a compaction, say):
    /// positions in them no longer locate their rows.
    gone: Vec<bool>,
}

impl FileTable {
    pub fn intern(&mut self, path: &str) -> u32 {
        if let Some(&id) = self.ids.get(path) {
            return id;
        }
        let id = self.paths.len() as u32;
        let p: Arc<str> = Arc::from(path);
        self.paths.push(p.clone());
        self.gone.push(false);
        self.ids.insert(p, id);
        id
    }

    pub fn path(&self, id: u32) -> &str {
        &self.paths[id as usize]
    }

    /// False once `mark_gone` said the file is no longer in the target.
    pub fn is_live(&self, id: u32) -> bool {
        !self.gone[id as usize]
    }

    /// Marks every file for which `live` is false as gone; returns how many.
    pub fn mark_gone(&mut self, live: impl Fn(&str) -> bool) -> usize {
        let mut n = 0;
        for (i, p) in self.paths.iter().enumerate() {
            if !self.gone[i] && !live(p) {
                self.gone[i] = true;
                n += 1;
            }
        }
        n
    }

    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Keeps only the files `used` marks (by id), renumbered in order;
    /// returns the old id → new id map (`u32::MAX`: dropped).
    pub fn retain(&mut self, used: &[bool]) -> Vec<u32> {
        let mut map = vec![u32::MAX; self.paths.len()];
        let mut next = FileTable::default();
        for (i, p) in self.paths.iter().enumerate() {
            if used.get(i).copied().unwrap_or(false) {
                let id = next.intern(p);
                next.gone[id as usize] = self.gone[i];
                map[i] = id;
            }
        }
        *self = next;
        map
    }
}

/// The key index. Keys and sequences are Arrow row-format bytes, so any key
/// type and any multi-column sequence compare with one `memcmp`.
#[derive(Default, Clone)]
pub struct KeyIndex {
    table: HashTable<u32>,
    slots: Slots,
    keys: Arena,
    spill: Vec<u8>,
    pub files: FileTable,
    live: usize,
    tombstones: usize,
    dirty: Vec<u32>,
    /// No tombstone is older than this (a lower bound; `None` when there are none),
    /// so that a commit with nothing to collect does not scan the index.
    oldest_tombstone_ms: Option<i64>,
}

impl std::fmt::Debug for KeyIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyIndex")
            .field("keys", &self.slots.len)
            .field("live", &self.live)
            .field("tombstones", &self.tombstones)
            .finish()
    }
}

fn key_of<'a>(keys: &'a Arena, s: &'a Slot) -> &'a [u8] {
    if s.flags & F_KEY_INLINE != 0 {
        &s.data[..s.key_len as usize]
    } else {
        keys.get(
            u32::from_le_bytes(s.data[..4].try_into().expect("4 bytes")),
            s.key_len,
        )
    }
}

/// Equality for short byte strings without a call into `memcmp`.
#[inline]
pub fn eq_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() <= 16 {
        let mut x = [0u8; 16];
        let mut y = [0u8; 16];
        x[..a.len()].copy_from_slice(a);
        y[..b.len()].copy_from_slice(b);
        return u128::from_ne_bytes(x) == u128::from_ne_bytes(y);
    }
    a == b
}

/// How many slots a walk over keys in no order of their slots (a batch's
/// lookups, the dirty list) asks for ahead of the one it is at, so that
/// their cache misses overlap instead of waiting for each in turn.
pub const LOOKUP_AHEAD: usize = 12;

/// A hint to the processor to bring `x`'s cache line in; no effect on
/// what the program computes.
#[inline]
pub fn prefetch<T: ?Sized>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing into the program;
    // the address is a live reference. `sse` is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

pub fn hash_key(key: &[u8]) -> u64 {
    xxh3_64(key)
}

impl KeyIndex {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(keys: usize) -> Self {
        KeyIndex {
            table: HashTable::with_capacity(keys),
            ..Default::default()
        }
    }

    /// Number of keys held (live rows plus tombstones).
    pub fn len(&self) -> usize {
        self.slots.len
    }

    pub fn is_empty(&self) -> bool {
        self.slots.len == 0
    }

    pub fn live(&self) -> usize {
        self.live
    }

    pub fn tombstones(&self) -> usize {
        self.tombstones
    }

    /// Heap bytes held by the index (capacities, not lengths).
    pub fn heap_bytes(&self) -> usize {
        // hashbrown: one u32 bucket plus one control byte per bucket.
        let buckets = if self.table.capacity() == 0 {
            0
        } else {
            (self.table.capacity() * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<u32>() + 1)
            + self.slots.bytes()
            + self.keys.bytes()
            + self.spill.capacity()
            + self.dirty.capacity() * 4
            + self.files.paths.iter().map(|p| p.len() + 48).sum::<usize>()
    }

    pub fn bytes_per_key(&self) -> f64 {
        if self.is_empty() {
            0.0
        } else {
            self.heap_bytes() as f64 / self.len() as f64
        }
    }

    fn slot_key<'a>(&'a self, s: &'a Slot) -> &'a [u8] {
        key_of(&self.keys, s)
    }

    fn slot_seq<'a>(&'a self, s: &'a Slot) -> &'a [u8] {
        if s.flags & F_KEY_INLINE != 0 {
            let k = s.key_len as usize;
            &s.data[k..k + s.seq_len as usize]
        } else if s.flags & F_SPILLED != 0 {
            let off = u64::from_le_bytes(s.data[4..12].try_into().expect("8 bytes")) as usize;
            let len = u32::from_le_bytes(s.data[12..16].try_into().expect("4 bytes")) as usize;
            &self.spill[off..off + len]
        } else {
            &s.data[4..4 + s.seq_len as usize]
        }
    }

    fn entry<'a>(&'a self, slot: u32, s: &'a Slot) -> EntryRef<'a> {
        let value = if s.flags & F_TOMBSTONE != 0 {
            Value::Tombstone {
                deleted_at_ms: s.payload as i64,
            }
        } else if s.flags & F_HAS_LOC != 0 {
            Value::Live(Some(Loc {
                file: (s.payload >> 32) as u32,
                pos: s.payload as u32,
            }))
        } else {
            Value::Live(None)
        };
        EntryRef {
            slot,
            key: self.slot_key(s),
            seq: self.slot_seq(s),
            fingerprint: s.fingerprint,
            value,
        }
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        self.table
            .find(hash, |&i| eq_bytes(self.slot_key(self.slots.get(i)), key))
            .copied()
    }

    pub fn get(&self, key: &[u8]) -> Option<EntryRef<'_>> {
        self.get_hashed(hash_key(key), key)
    }

    /// Starts loading, without waiting, the slot of the key with `hash` (and
    /// of any key whose hash looks like it), so that a `get_hashed` of it a
    /// little later finds the slot in the cache. A batch's lookups are
    /// independent: asking for a few ahead lets their cache misses overlap
    /// instead of waiting for each in turn.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        let _ = self.table.find(hash, |&i| {
            prefetch(self.slots.get(i));
            false
        });
    }

    /// Starts loading slot `i` (see `prefetch`); nothing when there is none.
    #[inline]
    pub fn prefetch_slot(&self, i: u32) {
        if (i as usize) < self.slots.len {
            prefetch(self.slots.get(i));
        }
    }

    pub fn get_hashed(&self, hash: u64, key: &[u8]) -> Option<EntryRef<'_>> {
        self.find(hash, key)
            .map(|i| self.entry(i, self.slots.get(i)))
    }

    fn set_seq(&mut self, idx: u32, seq: &[u8]) {
        let s = self.slots.get(idx);
        if s.flags & F_KEY_INLINE != 0 {
            let k = s.key_len as usize;
            if k + seq.len() <= SLOT_DATA {
                let s = self.slots.get_mut(idx);
                s.data[k..k + seq.len()].copy_from_slice(seq);
                s.seq_len = seq.len() as u8;
                return;
            }
            // The new sequence does not fit beside the key: move the key out.
            let key = s.data[..k].to_vec();
            let at = self.keys.push(&key);
            let s = self.slots.get_mut(idx);
            s.data[..4].copy_from_slice(&at.to_le_bytes());
            s.flags &= !F_KEY_INLINE;
        }
        let s = self.slots.get_mut(idx);
        if seq.len() <= SEQ_INLINE {
            s.data[4..4 + seq.len()].copy_from_slice(seq);
            s.seq_len = seq.len() as u8;
            s.flags &= !F_SPILLED;
        } else {
            // Reuse the key's spill space when the new sequence fits (a fixed-width
            // string sequence always does); otherwise append.
            let old = (s.flags & F_SPILLED != 0).then(|| {
                let off = u64::from_le_bytes(s.data[4..12].try_into().expect("8 bytes"));
                let len = u32::from_le_bytes(s.data[12..16].try_into().expect("4 bytes"));
                (off, len as usize)
            });
            let off = match old {
                Some((off, len)) if len >= seq.len() => {
                    let at = off as usize;
                    self.spill[at..at + seq.len()].copy_from_slice(seq);
                    off
                }
                _ => {
                    let off = self.spill.len() as u64;
                    self.spill.extend_from_slice(seq);
                    off
                }
            };
            s.data[4..12].copy_from_slice(&off.to_le_bytes());
            s.data[12..16].copy_from_slice(&(seq.len() as u32).to_le_bytes());
            s.seq_len = 0;
            s.flags |= F_SPILLED;
        }
    }

    /// Inserts or overwrites the entry of `key`. Marks it dirty (to persist).
    pub fn put(&mut self, hash: u64, key: &[u8], seq: &[u8], fingerprint: u64, value: Value) {
        self.put_hinted(None, hash, key, seq, fingerprint, value)
    }

    /// `put` with the slot a lookup just returned (checked, so a stale hint is harmless).
    pub fn put_hinted(
        &mut self,
        hint: Option<u32>,
        hash: u64,
        key: &[u8],
        seq: &[u8],
        fingerprint: u64,
        value: Value,
    ) {
        let found = match hint {
            Some(i)
                if (i as usize) < self.slots.len
                    && eq_bytes(self.slot_key(self.slots.get(i)), key) =>
            {
                Some(i)
            }
            _ => self.find(hash, key),
        };
        let idx = match found {
            Some(i) => {
                let s = self.slots.get(i);
                debug_assert!(
                    self.slot_seq(s) <= seq,
                    "sequence must not go backwards for a key"
                );
                if s.flags & F_TOMBSTONE != 0 {
                    self.tombstones -= 1;
                } else {
                    self.live -= 1;
                }
                i
            }
            None => {
                assert!(key.len() <= u16::MAX as usize, "key longer than 64 KiB");
                let mut data = [0u8; SLOT_DATA];
                let flags = if key.len() + seq.len() <= SLOT_DATA {
                    data[..key.len()].copy_from_slice(key);
                    F_KEY_INLINE
                } else {
                    data[..4].copy_from_slice(&self.keys.push(key).to_le_bytes());
                    0
                };
                let i = self.slots.push(Slot {
                    data,
                    key_len: key.len() as u16,
                    seq_len: 0,
                    flags,
                    fingerprint: 0,
                    payload: 0,
                });
                let (slots, keys) = (&self.slots, &self.keys);
                self.table
                    .insert_unique(hash, i, |&j| hash_key(key_of(keys, slots.get(j))));
                i
            }
        };
        self.set_seq(idx, seq);
        let s = self.slots.get_mut(idx);
        s.fingerprint = fingerprint;
        let was_dirty = s.flags & F_DIRTY != 0;
        s.flags &= F_SPILLED | F_KEY_INLINE;
        s.flags |= F_DIRTY;
        match value {
            Value::Live(Some(loc)) => {
                s.flags |= F_HAS_LOC;
                s.payload = ((loc.file as u64) << 32) | loc.pos as u64;
                self.live += 1;
            }
            Value::Live(None) => {
                s.payload = 0;
                self.live += 1;
            }
            Value::Tombstone { deleted_at_ms } => {
                s.flags |= F_TOMBSTONE;
                s.payload = deleted_at_ms as u64;
                self.tombstones += 1;
                self.oldest_tombstone_ms = Some(
                    self.oldest_tombstone_ms
                        .map_or(deleted_at_ms, |o| o.min(deleted_at_ms)),
                );
            }
        }
        if !was_dirty {
            self.dirty.push(idx);
        }
    }

    /// Moves live rows: every located entry for which `to` gives a new
    /// location takes it and is marked dirty (a compaction rewrote its file).
    /// Returns how many moved.
    pub fn relocate(&mut self, mut to: impl FnMut(Loc) -> Option<Loc>) -> usize {
        let mut moved = 0;
        for i in 0..self.slots.len as u32 {
            let s = self.slots.get_mut(i);
            if s.flags & (F_HAS_LOC | F_TOMBSTONE) != F_HAS_LOC {
                continue;
            }
            let loc = Loc {
                file: (s.payload >> 32) as u32,
                pos: s.payload as u32,
            };
            let Some(new) = to(loc).filter(|n| *n != loc) else {
                continue;
            };
            s.payload = ((new.file as u64) << 32) | new.pos as u64;
            moved += 1;
            if s.flags & F_DIRTY == 0 {
                s.flags |= F_DIRTY;
                self.dirty.push(i);
            }
        }
        moved
    }

    /// Forgets the data files no entry points into (a compaction leaves
    /// every file it rewrote behind), renumbering the others. Entries are
    /// not dirtied: the state table stores paths, not ids. Returns how many
    /// files went. Without it the file table grows with every commit.
    pub fn shrink_files(&mut self) -> usize {
        let located = |s: &Slot| s.flags & (F_HAS_LOC | F_TOMBSTONE) == F_HAS_LOC;
        let mut used = vec![false; self.files.len()];
        for s in self.slots.iter().filter(|s| located(s)) {
            used[(s.payload >> 32) as usize] = true;
        }
        let unused = used.iter().filter(|u| !**u).count();
        if unused == 0 {
            return 0;
        }
        let map = self.files.retain(&used);
        for i in 0..self.slots.len as u32 {
            let s = self.slots.get_mut(i);
            if located(s) {
                let file = map[(s.payload >> 32) as usize];
                s.payload = ((file as u64) << 32) | (s.payload & 0xffff_ffff);
            }
        }
        unused
    }

    pub fn iter(&self) -> impl Iterator<Item = EntryRef<'_>> + '_ {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| self.entry(i as u32, s))
    }

    /// Entries changed since the last `clear_dirty`.
    pub fn dirty(&self) -> impl Iterator<Item = EntryRef<'_>> + '_ {
        self.dirty_part(0, usize::MAX)
    }

    /// Those of `dirty` from the `skip`th on, at most `take`: the skipped
    /// ones are not read.
    pub fn dirty_part(&self, skip: usize, take: usize) -> impl Iterator<Item = EntryRef<'_>> + '_ {
        let list = self.dirty.get(skip..).unwrap_or_default();
        list.iter().take(take).enumerate().map(move |(j, &i)| {
            if let Some(&ahead) = list.get(j + LOOKUP_AHEAD) {
                self.prefetch_slot(ahead);
            }
            self.entry(i, self.slots.get(i))
        })
    }

    pub fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    pub fn clear_dirty(&mut self) {
        for (j, &i) in self.dirty.iter().enumerate() {
            if let Some(&ahead) = self.dirty.get(j + LOOKUP_AHEAD) {
                self.prefetch_slot(ahead);
            }
            self.slots.get_mut(i).flags &= !F_DIRTY;
        }
        self.dirty.clear();
        // A large load leaves a large dirty list behind; don't keep its memory.
        if self.dirty.capacity() > 4096 && self.dirty.capacity() > self.slots.len / 8 {
            self.dirty.shrink_to(1024);
        }
    }

    /// Drops tombstones whose delete was committed before `cutoff_ms`.
    /// Rebuilds the index (compacting the arenas); returns how many were dropped.
    /// Costs nothing when no tombstone can have expired; otherwise one pass.
    pub fn gc_tombstones(&mut self, cutoff_ms: i64) -> usize {
        if self.oldest_tombstone_ms.is_none_or(|o| o >= cutoff_ms) {
            return 0;
        }
        let mut expired = 0;
        let mut oldest: Option<i64> = None;
        for s in self.slots.iter().filter(|s| s.flags & F_TOMBSTONE != 0) {
            let t = s.payload as i64;
            if t < cutoff_ms {
                expired += 1;
            } else {
                oldest = Some(oldest.map_or(t, |o| o.min(t)));
            }
        }
        if expired == 0 {
            self.oldest_tombstone_ms = oldest;
            return 0;
        }
        let mut next = KeyIndex::with_capacity(self.slots.len - expired);
        next.files = std::mem::take(&mut self.files);
        for (i, s) in self.slots.iter().enumerate() {
            if s.flags & F_TOMBSTONE != 0 && (s.payload as i64) < cutoff_ms {
                continue;
            }
            let e = self.entry(i as u32, s);
            let dirty = s.flags & F_DIRTY != 0;
            next.put(hash_key(e.key), e.key, e.seq, e.fingerprint, e.value);
            if !dirty {
                let i = (next.slots.len - 1) as u32;
                next.slots.get_mut(i).flags &= !F_DIRTY;
                next.dirty.pop();
            }
        }
        *self = next;
        expired
    }

    /// Debug check of internal counters (cheap enough for tests and debug builds).
    pub fn check_invariants(&self) {
        let t = self
            .slots
            .iter()
            .filter(|s| s.flags & F_TOMBSTONE != 0)
            .count();
        assert_eq!(t, self.tombstones, "tombstone counter");
        assert_eq!(self.slots.len - t, self.live, "live counter");
        assert_eq!(self.table.len(), self.slots.len, "table and slots agree");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u64) -> Vec<u8> {
        let mut v = vec![1u8];
        v.extend_from_slice(&i.to_be_bytes());
        v
    }

    #[test]
    fn put_get_overwrite_and_counters() {
        let mut ix = KeyIndex::new();
        for i in 0..1000u64 {
            let key = k(i);
            ix.put(
                hash_key(&key),
                &key,
                &k(i * 2),
                i,
                Value::Live(Some(Loc {
                    file: 3,
                    pos: i as u32,
                })),
            );
        }
        let key = k(7);
        ix.put(
            hash_key(&key),
            &key,
            &k(99),
            5,
            Value::Tombstone {
                deleted_at_ms: 1234,
            },
        );
        ix.check_invariants();
        assert_eq!(ix.len(), 1000);
        assert_eq!(ix.live(), 999);
        assert_eq!(ix.tombstones(), 1);
        let e = ix.get(&k(7)).unwrap();
        assert_eq!(e.seq, &k(99)[..]);
        assert_eq!(
            e.value,
            Value::Tombstone {
                deleted_at_ms: 1234
            }
        );
        let e = ix.get(&k(8)).unwrap();
        assert_eq!(e.value, Value::Live(Some(Loc { file: 3, pos: 8 })));
        assert_eq!(e.fingerprint, 8);
        assert!(ix.get(&k(5000)).is_none());
        assert_eq!(ix.dirty_len(), 1000);
        ix.clear_dirty();
        assert_eq!(ix.dirty_len(), 0);
    }

    #[test]
    fn a_spilled_sequence_of_the_same_length_is_overwritten_in_place() {
        let mut ix = KeyIndex::new();
        let key = k(1);
        for i in 0..100u8 {
            let seq = vec![i; 40];
            ix.put(hash_key(&key), &key, &seq, i as u64, Value::Live(None));
            assert_eq!(ix.get(&key).unwrap().seq, &seq[..]);
        }
        assert_eq!(
            ix.spill.len(),
            40,
            "one key's updates must not grow the spill arena"
        );
    }

    #[test]
    fn long_sequences_spill_and_read_back() {
        let mut ix = KeyIndex::new();
        let seq: Vec<u8> = (0..40).collect();
        ix.put(hash_key(b"a"), b"a", &seq, 1, Value::Live(None));
        let seq2: Vec<u8> = (1..41).collect();
        ix.put(hash_key(b"a"), b"a", &seq2, 2, Value::Live(None));
        assert_eq!(ix.get(b"a").unwrap().seq, &seq2[..]);
        ix.put(hash_key(b"a"), b"a", b"short", 3, Value::Live(None));
        assert_eq!(ix.get(b"a").unwrap().seq, b"short");
    }

    #[test]
    fn inline_key_moves_out_when_the_sequence_grows() {
        let mut ix = KeyIndex::new();
        let key = k(42); // 9 bytes
        ix.put(hash_key(&key), &key, &k(1), 1, Value::Live(None));
        assert_eq!(ix.keys.bytes(), 0, "key and sequence fit in the slot");
        let long = vec![2u8; 30];
        ix.put(hash_key(&key), &key, &long, 2, Value::Live(None));
        assert_eq!(ix.get(&key).unwrap().seq, &long[..]);
        assert_eq!(ix.get(&key).unwrap().key, &key[..]);
        let mid = vec![3u8; 12];
        ix.put(hash_key(&key), &key, &mid, 3, Value::Live(None));
        let e = ix.get(&key).unwrap();
        assert_eq!((e.key, e.seq, e.fingerprint), (&key[..], &mid[..], 3));
        // A long key lives in the arena from the start.
        let big: Vec<u8> = (0..100).collect();
        ix.put(hash_key(&big), &big, &k(7), 4, Value::Live(None));
        assert_eq!(ix.get(&big).unwrap().seq, &k(7)[..]);
        assert_eq!(ix.iter().count(), 2);
        ix.check_invariants();
    }

    #[test]
    fn gc_drops_only_expired_tombstones_and_keeps_dirty_marks() {
        let mut ix = KeyIndex::new();
        for i in 0..10u64 {
            let key = k(i);
            let v = if i % 2 == 0 {
                Value::Tombstone {
                    deleted_at_ms: i as i64 * 100,
                }
            } else {
                Value::Live(None)
            };
            ix.put(hash_key(&key), &key, &k(1), 0, v);
        }
        ix.clear_dirty();
        let key = k(1);
        ix.put(hash_key(&key), &key, &k(2), 0, Value::Live(None));
        assert_eq!(ix.gc_tombstones(450), 3); // 0, 200, 400
        ix.check_invariants();
        assert_eq!(ix.len(), 7);
        assert!(ix.get(&k(0)).is_none());
        assert!(ix.get(&k(6)).is_some());
        assert_eq!(
            ix.dirty().map(|e| e.key.to_vec()).collect::<Vec<_>>(),
            vec![k(1)]
        );
    }

    #[test]
    fn relocated_rows_are_dirty_and_rewritten_files_are_forgotten() {
        let mut ix = KeyIndex::new();
        let (a, b) = (ix.files.intern("a"), ix.files.intern("b"));
        for i in 0..6u64 {
            let file = if i < 3 { a } else { b };
            let key = k(i);
            let loc = Loc {
                file,
                pos: i as u32,
            };
            ix.put(hash_key(&key), &key, &k(1), 0, Value::Live(Some(loc)));
        }
        let t = k(9);
        ix.put(
            hash_key(&t),
            &t,
            &k(1),
            0,
            Value::Tombstone { deleted_at_ms: 5 },
        );
        ix.clear_dirty();
        // "a" is rewritten into "c": its rows move, the others stay clean.
        let c = ix.files.intern("c");
        let moved = ix.relocate(|l| {
            (l.file == a).then_some(Loc {
                file: c,
                pos: 10 + l.pos,
            })
        });
        assert_eq!(moved, 3);
        let mut dirty: Vec<Vec<u8>> = ix.dirty().map(|e| e.key.to_vec()).collect();
        dirty.sort();
        assert_eq!(dirty, vec![k(0), k(1), k(2)]);
        assert_eq!(ix.shrink_files(), 1, "only `a` is unreferenced");
        assert_eq!(ix.files.len(), 2);
        for i in 0..6u64 {
            let Value::Live(Some(l)) = ix.get(&k(i)).unwrap().value else {
                panic!("key {i} lost its location");
            };
            let (path, pos) = if i < 3 { ("c", 10 + i) } else { ("b", i) };
            assert_eq!((ix.files.path(l.file), l.pos as u64), (path, pos));
        }
        assert!(matches!(
            ix.get(&t).unwrap().value,
            Value::Tombstone { deleted_at_ms: 5 }
        ));
        ix.check_invariants();
    }

    #[test]
    fn compact_for_one_long_key() {
        let n = 200_000u64;
        let mut ix = KeyIndex::new();
        for i in 0..n {
            let key = k(i);
            ix.put(
                hash_key(&key),
                &key,
                &k(i),
                i,
                Value::Live(Some(Loc {
                    file: 0,
                    pos: i as u32,
                })),
            );
        }
        ix.clear_dirty();
        let bpk = ix.bytes_per_key();
        assert!(bpk <= 64.0, "bytes per key {bpk}");
    }
}
