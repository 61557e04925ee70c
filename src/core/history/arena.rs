//! The arena of every key's events (`History`): keys in slots found
//! through a hash table of slot numbers, the dirty list a state commit
//! writes, the counts kept as they change, tombstone collection, and the
//! cache prefetches of walks over keys. Its fields are its own: resolving
//! and applying a plan go through its methods.

// hashbrown's default hasher (foldhash): keys are hashed on every event, and
// SipHash showed in SCD Type 2 profiles.
use hashbrown::{HashMap, HashTable};

use super::event::Event;
use crate::core::state::{FileTable, Loc, hash_key, prefetch};

/// The history of every key. Keys are row-encoded (`Codec::keys`).
///
/// Keys live in slots (a `Vec`) found through a hash table of slot
/// numbers, so a plan names the slot of each key it read and the dirty
/// list holds slot numbers: applying a batch and writing its state delta
/// hash no key again.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Slot numbers, hashed by their key (`hash_key`).
    table: HashTable<u32>,
    slots: Vec<Slot>,
    pub files: FileTable,
    /// Slots with a changed event, each once, with a bound below which
    /// none of its events changed: a commit's state delta, and clearing it,
    /// visit what changed, not a hot key's whole history.
    dirty: Vec<Dirty>,
    /// A bit per slot: listed in `dirty` (a bit, not a field of `Slot`:
    /// a history holds a slot per key).
    listed: Vec<u64>,
    /// Where each listed slot is in `dirty`: made when a listed slot
    /// changes again before the list is cleared (several batches in one
    /// commit), dropped with the list.
    dirty_at: Option<HashMap<u32, u32>>,
    /// The slots from this one on were made since the dirty list was last
    /// cleared (a commit): new keys, or keys put again after their
    /// tombstone was collected. Their rows in the state log start them.
    new_from: u32,
    events: usize,
    /// Keys whose latest event is an upsert (`live`), and the bytes of the
    /// keys and events held (`heap_bytes`): kept as they change, because
    /// the service reads both after every commit and a count would visit
    /// every event of the state.
    live: usize,
    held: usize,
    /// At most the delete time of every key whose latest event is a delete
    /// (none: no such key), so `gc_tombstones` costs nothing while none can
    /// have expired; exact after each of its scans.
    oldest_tombstone_ms: Option<i64>,
}

/// A slot with a changed event, none before `first`.
#[derive(Debug, Clone, Copy)]
struct Dirty {
    slot: u32,
    first: u32,
}

#[derive(Debug, Clone)]
struct Slot {
    key: Box<[u8]>,
    /// Exactly as many as held: a history holds a slot per key, and a
    /// vector's spare room was a tenth of the state.
    events: Box<[Event]>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &[u8]) -> Option<u32> {
        self.slot_hashed(hash_key(key), key)
    }

    /// The slot of `key`, whose `hash_key` is `hash`.
    pub(super) fn slot_hashed(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(hash, |&i| *slots[i as usize].key == *key)
            .copied()
    }

    pub fn get(&self, key: &[u8]) -> Option<&[Event]> {
        self.slot(key).map(|i| &*self.slots[i as usize].events)
    }

    /// Reading a key's events is a chain of cache misses (its slot, then
    /// its key and list of events, then each event); a walk over keys in
    /// no order of their slots asks for each link some keys ahead, so the
    /// misses of several keys overlap. These start loading one link
    /// without waiting for it (`state::prefetch`); none changes anything.
    ///
    /// Link 1: the slot of any key whose hash looks like `hash`.
    #[inline]
    pub fn prefetch_slot_of(&self, hash: u64) {
        let _ = self.table.find(hash, |&i| {
            prefetch(&self.slots[i as usize]);
            false
        });
    }

    /// Link 2: the key and the event list of the slots link 1 loaded.
    #[inline]
    pub fn prefetch_key_of(&self, hash: u64) {
        let _ = self.table.find(hash, |&i| {
            prefetch_lists(&self.slots[i as usize]);
            false
        });
    }

    /// Link 3, for a walk over keys that knows their slots (`slot(m)`: the
    /// slot of its `m`th key, if it has one) and is at its `n`th: asks for
    /// the slots, then the keys and event lists, then the latest events of
    /// the keys after it, each a few keys before it is needed.
    #[inline]
    pub(super) fn prefetch_ahead(&self, slot: impl Fn(usize) -> Option<u32>, n: usize) {
        prefetch_ahead(&self.slots, slot, n);
    }

    /// The events of `slot` (from `slot`).
    pub fn at(&self, slot: u32) -> &[Event] {
        &self.slots[slot as usize].events
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Events kept, over all keys.
    pub fn events(&self) -> usize {
        self.events
    }

    /// Keys whose latest event is an upsert.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Replaces the events of `key` from index `from` on with `events`
    /// (sorted by sequence, after those before `from`) and marks it dirty;
    /// each event that differs from the one it replaces (or is new) is
    /// marked changed. `hint`: the key's slot when it was read (`slot`),
    /// checked before it is used.
    ///
    /// A key is dirty (listed once in `dirty`) while it has a changed event.
    pub fn put(&mut self, hint: Option<u32>, key: Box<[u8]>, from: usize, events: Vec<Event>) {
        debug_assert!(events.windows(2).all(|w| w[0].seq() < w[1].seq()));
        match self.hinted(hint, &key).or_else(|| self.slot(&key)) {
            Some(i) => {
                let put = replace(&mut self.slots[i as usize], from, events);
                self.count_put(i, put);
            }
            None => self.put_new(key, from, events),
        }
    }

    /// `hint` when it is the slot of `key`.
    fn hinted(&self, hint: Option<u32>, key: &[u8]) -> Option<u32> {
        hint.filter(|&i| self.slots.get(i as usize).is_some_and(|s| *s.key == *key))
    }

    /// `put` for a key with no slot: a new slot with every event changed.
    fn put_new(&mut self, key: Box<[u8]>, from: usize, mut events: Vec<Event>) {
        debug_assert_eq!(from, 0, "a new key has no events before");
        events.iter_mut().for_each(|e| e.set_changed(true));
        let first = (!events.is_empty()).then_some(0);
        let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 keys");
        let put = Put {
            events: events.len() as isize,
            held: (key.len() + events.iter().map(Event::bytes).sum::<usize>()) as isize,
            live: is_live(&events) as isize,
            tombstone_ms: events.last().and_then(Event::deleted_at_ms),
            first,
            kept: 0,
        };
        self.slots.push(Slot {
            key,
            events: events.into_boxed_slice(),
        });
        index_slot(&mut self.table, &self.slots, i);
        self.count_put(i, put);
    }

    /// Takes in what `replace` (or `put_new`) did to slot `i`: the counts,
    /// the oldest tombstone, the dirty list.
    pub(super) fn count_put(&mut self, i: u32, put: Put) {
        self.events = self.events.wrapping_add_signed(put.events);
        self.held = self.held.wrapping_add_signed(put.held);
        self.live = self.live.wrapping_add_signed(put.live);
        if let Some(t) = put.tombstone_ms {
            self.oldest_tombstone_ms = Some(self.oldest_tombstone_ms.map_or(t, |o| o.min(t)));
        }
        self.mark_dirty(i, put.first, put.kept);
    }

    /// Lists `slot` as dirty once an event of it changed, `first` the
    /// first that did (None: none did); its events before `kept` are as
    /// they were (so a listed slot's bound stays within its events).
    fn mark_dirty(&mut self, slot: u32, first: Option<usize>, kept: usize) {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        let listed = self.listed.get(word).is_some_and(|w| w & bit != 0);
        let first = match first {
            Some(f) => f,
            None if listed => kept,
            None => return,
        };
        let first = u32::try_from(first).expect("fewer than 2^32 events per key");
        if !listed {
            if self.listed.len() <= word {
                self.listed.resize(word + 1, 0);
            }
            self.listed[word] |= bit;
            if let Some(at) = &mut self.dirty_at {
                at.insert(slot, self.dirty.len() as u32);
            }
            self.dirty.push(Dirty { slot, first });
            return;
        }
        let dirty = &self.dirty;
        let at = self.dirty_at.get_or_insert_with(|| {
            dirty
                .iter()
                .enumerate()
                .map(|(j, d)| (d.slot, j as u32))
                .collect()
        });
        let d = &mut self.dirty[at[&slot] as usize];
        d.first = d.first.min(first);
    }

    /// The slots below `mid` and those from `mid` on, apart, so each
    /// half's keys can be replaced on a thread of its own (`apply`); what
    /// each replacement did is then taken in with `count_put`.
    pub(super) fn halves(&mut self, mid: u32) -> (Half<'_>, Half<'_>) {
        let (lo, hi) = self.slots.split_at_mut(mid as usize);
        (
            Half { slots: lo, base: 0 },
            Half {
                slots: hi,
                base: mid,
            },
        )
    }

    /// Moves target rows: every event whose `loc` `to` maps elsewhere takes
    /// the new location, and its key is marked dirty (a compaction rewrote
    /// the row's file). Returns how many moved.
    pub fn relocate(&mut self, mut to: impl FnMut(Loc) -> Option<Loc>) -> usize {
        let mut moved = 0;
        for i in 0..self.slots.len() {
            let mut first = None;
            for (j, e) in self.slots[i].events.iter_mut().enumerate() {
                if let Some(new) = e.loc().and_then(&mut to).filter(|n| Some(*n) != e.loc()) {
                    e.set_loc(Some(new));
                    e.set_changed(true);
                    first = first.or(Some(j));
                    moved += 1;
                }
            }
            let kept = self.slots[i].events.len();
            self.mark_dirty(i as u32, first, kept);
        }
        moved
    }

    /// Forgets the data files no event points into, renumbering the others
    /// (see `KeyIndex::shrink_files`). Returns how many went.
    pub fn shrink_files(&mut self) -> usize {
        let mut used = vec![false; self.files.len()];
        for e in self.slots.iter().flat_map(|s| &s.events) {
            if let Some(l) = e.loc() {
                used[l.file as usize] = true;
            }
        }
        let unused = used.iter().filter(|u| !**u).count();
        if unused == 0 {
            return 0;
        }
        let map = self.files.retain(&used);
        for e in self.slots.iter_mut().flat_map(|s| s.events.iter_mut()) {
            if let Some(mut l) = e.loc() {
                l.file = map[l.file as usize];
                e.set_loc(Some(l));
            }
        }
        unused
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[Event])> + '_ {
        self.slots.iter().map(|s| (&*s.key, &*s.events))
    }

    /// (slot, key, events) of every key.
    pub fn iter_slots(&self) -> impl Iterator<Item = (u32, &[u8], &[Event])> + '_ {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, &*s.key, &*s.events))
    }

    /// The keys with a changed event, each once, with what the next state
    /// commit writes of each (unless whole): `(key, events, starts)`.
    /// - `starts`: every event of the key, each written, marked as where
    ///   the key's events start (rows of earlier commits are not the
    ///   key's): a key whose slot was made since the last commit (new, or
    ///   put again after its tombstone was collected).
    /// - otherwise its events from its first changed event on, of which
    ///   the changed are written: the key's other events are in the log.
    pub fn dirty(&self) -> impl Iterator<Item = (&[u8], &[Event], bool)> + '_ {
        self.dirty_part(0, usize::MAX)
    }

    /// Those of `dirty` from the `skip`th key on, at most `take` keys: the
    /// skipped ones are not read.
    pub fn dirty_part(
        &self,
        skip: usize,
        take: usize,
    ) -> impl Iterator<Item = (&[u8], &[Event], bool)> + '_ {
        let list = self.dirty.get(skip..).unwrap_or_default();
        list.iter().take(take).map(|d| {
            let s = &self.slots[d.slot as usize];
            let starts = d.slot >= self.new_from;
            let from = if starts { 0 } else { d.first as usize };
            (&*s.key, &s.events[from..], starts)
        })
    }

    /// The keys the next state commit writes rows of (unless whole).
    pub fn dirty_keys(&self) -> usize {
        self.dirty.len()
    }

    /// The rows the next state commit writes (unless whole).
    pub fn dirty_len(&self) -> usize {
        self.dirty()
            .map(|(_, e, starts)| {
                if starts {
                    e.len()
                } else {
                    e.iter().filter(|e| e.changed()).count()
                }
            })
            .sum()
    }

    pub fn clear_dirty(&mut self) {
        self.new_from = u32::try_from(self.slots.len()).expect("fewer than 2^32 keys");
        for d in std::mem::take(&mut self.dirty) {
            self.listed[d.slot as usize / 64] &= !(1u64 << (d.slot % 64));
            let s = &mut self.slots[d.slot as usize];
            s.events[d.first as usize..]
                .iter_mut()
                .for_each(|e| e.set_changed(false));
        }
        self.dirty_at = None;
    }

    /// SCD Type 1: forgets keys whose latest change is a delete committed
    /// before `cutoff_ms` (like a collected tombstone: a late older change
    /// for the key is applied again). Returns how many. Costs nothing while
    /// no tombstone can have expired (every commit calls it); otherwise one
    /// pass, and a second to drop the expired.
    pub fn gc_tombstones(&mut self, cutoff_ms: i64) -> usize {
        if self.oldest_tombstone_ms.is_none_or(|o| o >= cutoff_ms) {
            return 0;
        }
        let tombstone = |s: &Slot| s.events.last().and_then(Event::deleted_at_ms);
        let gone = |s: &Slot| tombstone(s).is_some_and(|t| t < cutoff_ms);
        self.oldest_tombstone_ms = self
            .slots
            .iter()
            .filter_map(tombstone)
            .filter(|&t| t >= cutoff_ms)
            .min();
        if !self.slots.iter().any(gone) {
            return 0;
        }
        let before = self.slots.len();
        let (mut dropped, mut bytes) = (0, 0);
        // Slots keep their order: those made since the last commit stay last.
        let (mut at, mut old_kept, new_from) = (0, 0, self.new_from);
        self.slots.retain(|s| {
            let g = gone(s);
            if g {
                dropped += s.events.len();
                bytes += s.key.len() + s.events.iter().map(Event::bytes).sum::<usize>();
            } else if at < new_from {
                old_kept += 1;
            }
            at += 1;
            !g
        });
        self.new_from = old_kept;
        // A dropped key's latest event is a delete: it was not live.
        self.events -= dropped;
        self.held -= bytes;
        // Slots moved: number them again (a key put again before the next
        // commit is listed anew).
        self.table.clear();
        for i in 0..self.slots.len() as u32 {
            index_slot(&mut self.table, &self.slots, i);
        }
        // A slot is listed while it has a changed event.
        self.dirty.clear();
        self.dirty_at = None;
        self.listed.iter_mut().for_each(|w| *w = 0);
        for i in 0..self.slots.len() as u32 {
            let events = &self.slots[i as usize].events;
            let (first, kept) = (events.iter().position(Event::changed), events.len());
            self.mark_dirty(i, first, kept);
        }
        before - self.slots.len()
    }

    /// An estimate of the memory the history holds: what it allocated,
    /// spare capacity included (not the allocator's rounding).
    pub fn heap_bytes(&self) -> usize {
        self.table.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.dirty.capacity() * std::mem::size_of::<Dirty>()
            + self.dirty_at.as_ref().map_or(0, |m| m.capacity() * 9)
            + self.listed.capacity() * std::mem::size_of::<u64>()
            + self.held
    }

    /// Checks the kept counts against a count over every slot, and the
    /// dirty list against the changed events (tests).
    pub fn check_counts(&self) {
        let slots = &self.slots;
        assert!(self.new_from as usize <= slots.len());
        assert_eq!(
            self.events,
            slots.iter().map(|s| s.events.len()).sum::<usize>()
        );
        assert_eq!(
            self.live,
            slots.iter().filter(|s| is_live(&s.events)).count()
        );
        let held: usize = slots
            .iter()
            .map(|s| s.key.len() + s.events.iter().map(Event::bytes).sum::<usize>())
            .sum();
        assert_eq!(self.held, held);
        // Every slot with a changed event is listed once, none of its
        // events before its bound changed.
        let mut listed = vec![false; slots.len()];
        for (j, d) in self.dirty.iter().enumerate() {
            let (i, first) = (d.slot as usize, d.first as usize);
            assert!(!listed[i], "slot {i} listed twice");
            listed[i] = true;
            assert!(self.listed[i / 64] & (1 << (i % 64)) != 0);
            if let Some(at) = &self.dirty_at {
                assert_eq!(at.get(&d.slot), Some(&(j as u32)));
            }
            assert!(first <= slots[i].events.len());
            assert!(!slots[i].events[..first].iter().any(Event::changed));
        }
        for (i, s) in slots.iter().enumerate() {
            assert!(
                listed[i] || !s.events.iter().any(Event::changed),
                "slot {i} has a changed event and is not listed"
            );
        }
    }

    /// The bytes of the encoded values among `heap_bytes` (what remains is
    /// the state's own overhead: keys, sequences, fingerprints, locations,
    /// headers, the index).
    pub fn value_bytes(&self) -> usize {
        self.slots
            .iter()
            .flat_map(|s| &s.events)
            .map(|e| e.vals().value_bytes())
            .sum()
    }
}

/// The slots of a history from slot `base` on, up to the next half's
/// (`History::halves`). Slot numbers are the history's.
pub(super) struct Half<'a> {
    slots: &'a mut [Slot],
    base: u32,
}

impl Half<'_> {
    /// Whether slot `i` (of this half) holds `key`.
    #[inline]
    pub(super) fn holds(&self, i: u32, key: &[u8]) -> bool {
        *self.slots[(i - self.base) as usize].key == *key
    }

    /// Replaces the events of slot `i` (of this half) from index `from` on
    /// with `events`, as `History::put` does, leaving the counts and the
    /// dirty list to `History::count_put`.
    pub(super) fn replace(&mut self, i: u32, from: usize, events: Vec<Event>) -> Put {
        replace(&mut self.slots[(i - self.base) as usize], from, events)
    }

    /// `History::prefetch_ahead` over the slots of this half.
    #[inline]
    pub(super) fn prefetch_ahead(&self, slot: impl Fn(usize) -> Option<u32>, n: usize) {
        prefetch_ahead(self.slots, |m| slot(m).map(|i| i - self.base), n);
    }
}

/// Whether a key with these events has a row: its latest event is an upsert.
fn is_live(events: &[Event]) -> bool {
    events.last().is_some_and(|e| !e.is_delete())
}

/// Lists slot `i` in `table` under its key's hash.
fn index_slot(table: &mut HashTable<u32>, slots: &[Slot], i: u32) {
    table.insert_unique(hash_key(&slots[i as usize].key), i, |&j| {
        hash_key(&slots[j as usize].key)
    });
}

/// What `replace` did to a slot, for the history's counts (`count_put`):
/// the change in events, bytes held and live keys; the key's delete time
/// if its latest event is a delete; the first changed event (None: none)
/// and how many events before it are as they were.
#[derive(Debug, Clone, Copy)]
pub(super) struct Put {
    events: isize,
    held: isize,
    live: isize,
    tombstone_ms: Option<i64>,
    first: Option<usize>,
    kept: usize,
}

/// Replaces the events of slot `s` from index `from` on with `events`
/// (sorted by sequence, after those before `from`); each event that
/// differs from the one it replaces (or is new) is marked changed. Touches
/// only `s`: slots are replaced on two threads (`apply`).
fn replace(s: &mut Slot, from: usize, mut events: Vec<Event>) -> Put {
    debug_assert!(from <= s.events.len(), "a plan applies to its history");
    let from = from.min(s.events.len());
    let live_was = is_live(&s.events) as isize;
    let held_was = s.events[from..].iter().map(Event::bytes).sum::<usize>() as isize;
    let held_now = events.iter().map(Event::bytes).sum::<usize>() as isize;
    mark_changed(&s.events[from..], &mut events);
    // The events before `from` are as they were: one of them changed only
    // in a slot already dirty.
    let first = events.iter().position(Event::changed).map(|j| from + j);
    let count = events.len() as isize - (s.events.len() - from) as isize;
    let mut kept = std::mem::take(&mut s.events).into_vec();
    kept.truncate(from);
    kept.reserve_exact(events.len());
    kept.extend(events);
    s.events = kept.into_boxed_slice();
    debug_assert!(s.events.windows(2).all(|w| w[0].seq() < w[1].seq()));
    Put {
        events: count,
        held: held_now - held_was,
        live: is_live(&s.events) as isize - live_was,
        tombstone_ms: s.events.last().and_then(Event::deleted_at_ms),
        first,
        kept: from,
    }
}

/// Marks each of `new` changed that is not in `old` as it is there (both
/// sorted by sequence); a change not yet committed stays marked.
fn mark_changed(old: &[Event], new: &mut [Event]) {
    let mut o = old.iter().peekable();
    for e in new.iter_mut() {
        while o.next_if(|x| x.seq() < e.seq()).is_some() {}
        if !o.peek().is_some_and(|x| x.same_as(e)) {
            e.set_changed(true);
        }
    }
}

/// How many keys ahead the walks that read each key's events whole
/// (`resolve`, `apply`) ask for them: each key is a few microseconds of
/// work, so a few keys hide a miss.
const KEY_AHEAD: usize = 4;

/// At most this many of a key's last events are prefetched: a hot key's
/// long history is not read whole by a batch.
const EVENTS_AHEAD: usize = 8;

/// A walk over keys (`slot(m)`: the slot of its `m`th key, if it has one)
/// is at its `n`th: ask for the links (`History::prefetch_slot_of`) of the
/// keys after it, each link a few keys before it is needed.
fn prefetch_ahead(slots: &[Slot], slot: impl Fn(usize) -> Option<u32>, n: usize) {
    let at = |m: usize| slot(m).and_then(|i| slots.get(i as usize));
    if let Some(s) = at(n + 3 * KEY_AHEAD) {
        prefetch(s);
    }
    if let Some(s) = at(n + 2 * KEY_AHEAD) {
        prefetch_lists(s);
    }
    if let Some(s) = at(n + KEY_AHEAD) {
        // A batch reads and changes a key's latest events, mostly.
        let tail = &s.events[s.events.len().saturating_sub(EVENTS_AHEAD)..];
        tail.iter().for_each(Event::prefetch);
    }
}

/// Link 2 (`History::prefetch_key_of`) of a loaded slot: its key and its
/// event list.
fn prefetch_lists(s: &Slot) {
    prefetch(&*s.key);
    prefetch(&*s.events);
}

#[cfg(test)]
mod tests {
    use super::History;
    use crate::core::history::Event;
    use crate::core::history::event::tests::ev;
    use crate::core::state::Loc;

    #[test]
    fn tombstones_expire_by_their_delete_time_whatever_was_written_since() {
        let mut h = History::new();
        let del = |seq, t| ev(seq, b"", Some(t), None);
        h.put(
            None,
            vec![1].into(),
            0,
            vec![ev(1, b"a", None, None), del(2, 100)],
        );
        h.put(None, vec![2].into(), 0, vec![del(1, 200)]);
        assert_eq!(h.live(), 0, "both keys end in a delete");
        h.check_counts();
        assert_eq!(h.gc_tombstones(100), 0, "none older than the cutoff");
        assert_eq!(h.gc_tombstones(150), 1);
        h.check_counts();
        assert!(h.get(&[1]).is_none() && h.get(&[2]).is_some());
        assert_eq!(h.gc_tombstones(150), 0);
        // Key 2 is upserted after its delete: no longer a tombstone.
        h.put(
            h.slot(&[2]),
            vec![2].into(),
            1,
            vec![ev(3, b"b", None, None)],
        );
        assert_eq!(h.gc_tombstones(300), 0);
        assert_eq!((h.len(), h.live()), (1, 1));
        h.check_counts();
        // Deleted again, at a time before the bound the last scan left, and
        // a new key deleted: both expire.
        h.put(None, vec![3].into(), 0, vec![del(1, 250)]);
        h.put(h.slot(&[2]), vec![2].into(), 2, vec![del(4, 50)]);
        assert_eq!(h.gc_tombstones(240), 1);
        assert_eq!(h.gc_tombstones(260), 1);
        assert!(h.is_empty());
        assert_eq!((h.events(), h.live()), (0, 0));
        h.check_counts();
    }

    #[test]
    fn put_marks_only_what_differs_and_gc_keeps_every_other_key_findable() {
        let mut h = History::new();
        let loc = |pos| Some(Loc { file: 0, pos });
        for k in 0u8..6 {
            let deleted = (k % 2 == 0).then_some(10);
            h.put(
                None,
                vec![k].into(),
                0,
                vec![ev(1, b"a", None, loc(k as u32)), ev(2, b"b", deleted, None)],
            );
        }
        assert_eq!((h.len(), h.events(), h.dirty().count()), (6, 12, 6));
        h.clear_dirty();
        assert_eq!(h.dirty_len(), 0);
        // Same events again: nothing changed. A moved location: that event only.
        let slot = h.slot(&[1]);
        h.put(
            slot,
            vec![1].into(),
            0,
            vec![ev(1, b"a", None, loc(1)), ev(2, b"b", None, None)],
        );
        assert_eq!(h.dirty().count(), 0);
        h.put(
            slot,
            vec![1].into(),
            0,
            vec![ev(1, b"a", None, loc(5)), ev(2, b"b", None, None)],
        );
        let changed: Vec<bool> = h.get(&[1]).unwrap().iter().map(Event::changed).collect();
        assert_eq!(changed, [true, false]);
        // From an index on: the events before stay as they are.
        h.put(
            slot,
            vec![1].into(),
            1,
            vec![ev(2, b"b", None, None), ev(3, b"c", None, None)],
        );
        let seqs: Vec<&[u8]> = h.get(&[1]).unwrap().iter().map(Event::seq).collect();
        assert_eq!(seqs, [&[1u8][..], &[2], &[3]]);
        let changed: Vec<bool> = h.get(&[1]).unwrap().iter().map(Event::changed).collect();
        assert_eq!(changed, [true, false, true]);
        assert_eq!(h.events(), 13);
        // A stale hint is not trusted.
        h.put(Some(0), vec![3].into(), 0, vec![ev(1, b"z", None, None)]);
        assert_eq!(h.get(&[3]).unwrap()[0].vals().get(0), b"z");
        assert_eq!(h.get(&[0]).unwrap().len(), 2);
        // Keys 0, 2, 4 end in deletes at 10: collected; the others keep
        // their events, slots and dirt.
        h.check_counts();
        assert_eq!(h.gc_tombstones(11), 3);
        assert_eq!((h.len(), h.events()), (3, 6));
        h.check_counts();
        for k in [0u8, 2, 4] {
            assert!(h.get(&[k]).is_none() && h.slot(&[k]).is_none());
        }
        for k in [1u8, 3, 5] {
            let s = h.slot(&[k]).expect("kept");
            assert_eq!(h.at(s), h.get(&[k]).unwrap());
        }
        let mut dirty: Vec<&[u8]> = h.dirty().map(|(k, _, _)| k).collect();
        dirty.sort();
        assert_eq!(dirty, [&[1u8][..], &[3u8][..]]);
        h.put(None, vec![2].into(), 0, vec![ev(4, b"c", None, None)]);
        assert_eq!((h.len(), h.dirty().count()), (4, 3));
    }
}
