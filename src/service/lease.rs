//! One committer per flow across the instances that share a NATS JetStream
//! log: a lease per flow in the key-value bucket `<stream_prefix>_LEASES`.
//!
//! API boundary: `Leases::tick` is called on a timer by the service; each
//! flow's committer only reads `FlowLease::holds` / `epoch`. Nothing here
//! knows about tables or batches.
//!
//! Invariants:
//! - A lease is taken with `create` (only when the key is absent: never
//!   held, released, or expired) and renewed with `update` at the revision
//!   the holder last wrote: both compare-and-set on the server. The bucket's
//!   `max_age` is the lease's time to live, so a dead holder's lease
//!   disappears by itself, measured by the server, not by any client clock.
//! - The epoch is the revision at which the lease was taken: it only grows.
//! - A holder that could not renew for a whole TTL (NATS unreachable, the
//!   process paused) stops committing before anyone can have taken over,
//!   except when the process itself was paused: a commit it resumes loses
//!   on the catalog's compare-and-swap, and the offsets the target records
//!   make a repeat harmless.
//! - Flows spread over the live instances by consistent hashing with
//!   bounded loads (`assign`: rendezvous ranks, at most ceil(flows /
//!   instances) each): instances announce themselves in
//!   `<stream_prefix>_INSTANCES` (same TTL); each takes only the flows
//!   assigned to it, gives back the ones no longer assigned to it, and takes
//!   any lease that stayed vacant for a whole TTL (its assignee is not
//!   taking it).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use futures::StreamExt;

use crate::error::{Error, Result};

/// What the bucket holds for a flow.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Record {
    holder: String,
    epoch: u64,
}

/// The lease of one flow as this instance sees it.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct LeaseStatus {
    /// This instance holds it (and may commit).
    pub held_here: bool,
    /// The instance that holds it, when known.
    pub holder: Option<String>,
    /// The revision at which the holder took it (only grows).
    pub epoch: Option<u64>,
    /// Times this instance took or lost this flow's lease.
    pub changes: u64,
}

#[derive(Default)]
struct FlowLease {
    /// The revision this instance last wrote, while it holds the lease.
    revision: Option<u64>,
    epoch: Option<u64>,
    renewed: Option<Instant>,
    holder: Option<String>,
    changes: u64,
    /// Since when this instance has seen the lease vacant.
    vacant_since: Option<Instant>,
}

pub struct Leases {
    leases: kv::Store,
    instances: kv::Store,
    /// Core NATS, for `ask_commit` and `commit_requests`.
    client: async_nats::Client,
    /// `<stream_prefix>.commit-now`: `.<flow>` asks the holder to commit.
    commit_subject: String,
    me: String,
    ttl: Duration,
    flows: Mutex<HashMap<String, FlowLease>>,
}

impl Leases {
    /// Opens (or makes) the two buckets and announces this instance.
    pub async fn open(
        js: &jetstream::Context,
        prefix: &str,
        replicas: usize,
        me: String,
        ttl: Duration,
    ) -> Result<Leases> {
        let bucket = |name: &str| kv::Config {
            bucket: format!("{prefix}_{name}"),
            history: 1,
            max_age: ttl,
            num_replicas: replicas,
            ..Default::default()
        };
        let open = |name: &str| crate::service::nats_conn::key_value(js, bucket(name));
        let leases = Leases {
            leases: open("LEASES").await?,
            instances: open("INSTANCES").await?,
            client: js.client(),
            commit_subject: format!("{prefix}.commit-now"),
            me,
            ttl,
            flows: Mutex::new(HashMap::new()),
        };
        leases.announce().await?;
        Ok(leases)
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// Asks whichever instance holds `flow` to commit through `offset` now
    /// (a client waits here for a commit): a core NATS message, lost if
    /// no one holds the flow, so the asker repeats it while it waits.
    pub async fn ask_commit(&self, flow: &str, offset: i64) -> Result<()> {
        self.client
            .publish(
                format!("{}.{flow}", self.commit_subject),
                offset.to_string().into(),
            )
            .await
            .map_err(|e| Error::Unavailable(format!("NATS: asking for a commit: {e}")))
    }

    /// The requests of `ask_commit` for any flow: (flow, offset) pairs,
    /// read by the holder's `run::answer_commit_requests`.
    pub async fn commit_requests(&self) -> Result<async_nats::Subscriber> {
        self.client
            .subscribe(format!("{}.*", self.commit_subject))
            .await
            .map_err(|e| Error::Unavailable(format!("NATS: subscribing to commit requests: {e}")))
    }

    /// A request of `ask_commit`, read back: the flow and the offset.
    pub fn commit_request(message: &async_nats::Message) -> Option<(&str, i64)> {
        let flow = message.subject.as_str().rsplit('.').next()?;
        let offset = std::str::from_utf8(&message.payload).ok()?.parse().ok()?;
        Some((flow, offset))
    }

    /// How often `tick` should run.
    pub fn period(&self) -> Duration {
        self.ttl / 4
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, FlowLease>> {
        self.flows.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn announce(&self) -> Result<()> {
        self.instances
            .put(&self.me, bytes::Bytes::from_static(b"{}"))
            .await
            .map_err(|e| Error::Unavailable(format!("NATS: announcing this instance: {e}")))?;
        Ok(())
    }

    async fn live_instances(&self) -> Result<HashSet<String>> {
        let mut keys = self
            .instances
            .keys()
            .await
            .map_err(|e| Error::Unavailable(format!("NATS: listing instances: {e}")))?;
        let mut out = HashSet::new();
        while let Some(k) = keys.next().await {
            out.insert(k.map_err(|e| Error::Unavailable(format!("NATS: listing instances: {e}")))?);
        }
        out.insert(self.me.clone());
        Ok(out)
    }

    /// Which live instance commits each flow: consistent hashing with
    /// bounded loads. Flows in the order of their own hash each go to the
    /// instance that ranks highest for them (rendezvous) among those below
    /// ceil(flows / instances), so no instance holds more than that, and
    /// a flow moves only when an instance comes or goes or a flow is added
    /// or removed ahead of it. Every instance computes the same answer from
    /// the same flows and live set; while their views differ, the vacancy
    /// rule in `tick_flow` fills any gap.
    pub fn assign<'a>(flows: &'a [String], live: &'a HashSet<String>) -> HashMap<&'a str, &'a str> {
        let mut out = HashMap::with_capacity(flows.len());
        if live.is_empty() {
            return out;
        }
        let cap = flows.len().div_ceil(live.len());
        let mut instances: Vec<&str> = live.iter().map(String::as_str).collect();
        instances.sort_unstable();
        let mut load: HashMap<&str, usize> = HashMap::with_capacity(instances.len());
        let mut order: Vec<&str> = flows.iter().map(String::as_str).collect();
        order.sort_unstable_by_key(|f| (xxhash_rust::xxh3::xxh3_64(f.as_bytes()), *f));
        order.dedup();
        let rank =
            |flow: &str, i: &str| xxhash_rust::xxh3::xxh3_64(format!("{flow}\n{i}").as_bytes());
        for flow in order {
            let mut ranked = instances.clone();
            ranked.sort_unstable_by_key(|i| (std::cmp::Reverse(rank(flow, i)), *i));
            let Some(i) = ranked
                .into_iter()
                .find(|i| load.get(i).copied().unwrap_or(0) < cap)
            else {
                continue;
            };
            *load.entry(i).or_default() += 1;
            out.insert(flow, i);
        }
        out
    }

    /// Whether this instance may commit `flow` now: it holds the lease and
    /// renewed it less than a TTL ago.
    pub fn holds(&self, flow: &str) -> Option<u64> {
        let g = self.lock();
        let l = g.get(flow)?;
        let fresh = l.renewed.is_some_and(|t| t.elapsed() < self.ttl);
        l.revision.and(l.epoch).filter(|_| fresh)
    }

    pub fn status(&self, flow: &str) -> LeaseStatus {
        let held = self.holds(flow);
        let g = self.lock();
        let l = g.get(flow);
        LeaseStatus {
            held_here: held.is_some(),
            holder: l.and_then(|l| l.holder.clone()),
            epoch: l.and_then(|l| l.epoch),
            changes: l.map_or(0, |l| l.changes),
        }
    }

    /// One round: announce this instance, then renew, take or give back
    /// each flow's lease. Errors are per flow and logged; the round goes on.
    pub async fn tick(&self, flows: &[String]) {
        if let Err(e) = self.announce().await {
            tracing::warn!(error = %e, "lease_tick_failed");
            return;
        }
        let live = match self.live_instances().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "lease_tick_failed");
                return;
            }
        };
        let owners = Self::assign(flows, &live);
        for flow in flows {
            let mine = owners.get(flow.as_str()) == Some(&self.me.as_str());
            if let Err(e) = self.tick_flow(flow, mine).await {
                tracing::warn!(flow = %flow, error = %e, "lease_tick_failed");
            }
        }
    }

    async fn tick_flow(&self, flow: &str, first: bool) -> Result<()> {
        let held = self.lock().get(flow).and_then(|l| l.revision.zip(l.epoch));
        if let Some((rev, epoch)) = held {
            if !first {
                // Another instance ranks first now: stop committing, then
                // give the flow back.
                self.lost(flow, "rebalanced");
                let _ = self.leases.delete_expect_revision(flow, Some(rev)).await;
                return Ok(());
            }
            let value = self.value(epoch)?;
            match self.leases.update(flow, value, rev).await {
                Ok(rev) => {
                    let mut g = self.lock();
                    let l = g.entry(flow.to_string()).or_default();
                    l.revision = Some(rev);
                    l.renewed = Some(Instant::now());
                }
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    self.lost(flow, "taken");
                }
                // Unknown: keep it until the TTL says otherwise (`holds`).
                Err(e) => return Err(Error::Unavailable(format!("renewing the lease: {e}"))),
            }
            return Ok(());
        }
        let entry = self
            .leases
            .entry(flow)
            .await
            .map_err(|e| Error::Unavailable(format!("reading the lease: {e}")))?;
        let current = entry
            .filter(|e| e.operation == kv::Operation::Put)
            .and_then(|e| serde_json::from_slice::<Record>(&e.value).ok());
        let vacant_long = {
            let mut g = self.lock();
            let l = g.entry(flow.to_string()).or_default();
            l.holder = current.as_ref().map(|r| r.holder.clone());
            l.epoch = current.as_ref().map(|r| r.epoch);
            match &current {
                Some(_) => {
                    l.vacant_since = None;
                    false
                }
                None => l.vacant_since.get_or_insert_with(Instant::now).elapsed() >= self.ttl,
            }
        };
        if current.is_some() || !(first || vacant_long) {
            return Ok(());
        }
        // Vacant and ours: take it. The epoch is the revision it lands at,
        // written into the record by the first renewal.
        match self.leases.create(flow, self.value(0)?).await {
            Ok(epoch) => {
                let value = self.value(epoch)?;
                let rev =
                    self.leases.update(flow, value, epoch).await.map_err(|e| {
                        Error::Unavailable(format!("writing the lease's epoch: {e}"))
                    })?;
                let mut g = self.lock();
                let l = g.entry(flow.to_string()).or_default();
                l.revision = Some(rev);
                // The epoch the record says, which every instance reads.
                l.epoch = Some(epoch);
                l.renewed = Some(Instant::now());
                l.holder = Some(self.me.clone());
                l.changes += 1;
                l.vacant_since = None;
                tracing::info!(flow = %flow, epoch, instance = %self.me, "lease_taken");
            }
            // Another instance was quicker.
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::Unavailable(format!("taking the lease: {e}"))),
        }
        Ok(())
    }

    fn value(&self, epoch: u64) -> Result<bytes::Bytes> {
        Ok(serde_json::to_vec(&Record {
            holder: self.me.clone(),
            epoch,
        })?
        .into())
    }

    pub(crate) fn lost(&self, flow: &str, why: &str) {
        let mut g = self.lock();
        let l = g.entry(flow.to_string()).or_default();
        if l.revision.take().is_some() {
            l.changes += 1;
            l.renewed = None;
            tracing::warn!(flow = %flow, instance = %self.me, why, "lease_lost");
        }
    }

    /// Gives back `flow`'s lease if this instance holds it (the flow was
    /// deleted, after its last commit).
    pub async fn release(&self, flow: &str) {
        let held = self.lock().get(flow).and_then(|l| l.revision);
        if let Some(rev) = held {
            self.lost(flow, "released");
            let _ = self.leases.delete_expect_revision(flow, Some(rev)).await;
        }
        self.lock().remove(flow);
    }

    /// Gives back every lease this instance holds (at shutdown, after the
    /// last commits), so another instance takes the flows at once.
    pub async fn release_all(&self) {
        let held: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, l)| l.revision.is_some())
            .map(|(f, _)| f.clone())
            .collect();
        for flow in held {
            self.release(&flow).await;
        }
        let _ = self.instances.delete(&self.me).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    fn loads<'a>(owners: &HashMap<&'a str, &'a str>) -> HashMap<&'a str, usize> {
        let mut out = HashMap::new();
        for i in owners.values() {
            *out.entry(*i).or_default() += 1;
        }
        out
    }

    #[test]
    fn six_flows_over_three_instances_are_two_each() {
        // Rendezvous hashing alone gave these 3, 0, 3.
        let flows = names("flow", 6);
        let live: HashSet<String> = names("instance-", 3).into_iter().collect();
        let owners = Leases::assign(&flows, &live);
        assert_eq!(owners.len(), 6);
        let l = loads(&owners);
        assert_eq!(l.len(), 3, "{l:?}");
        assert!(l.values().all(|&n| n == 2), "{l:?}");
    }

    #[test]
    fn every_flow_goes_to_one_live_instance_and_none_holds_more_than_its_share() {
        for n in 1..8 {
            let live: HashSet<String> = names("i", n).into_iter().collect();
            for f in 0..50 {
                let flows = names("f", f);
                let owners = Leases::assign(&flows, &live);
                assert_eq!(owners.len(), f);
                assert!(owners.values().all(|i| live.contains(*i)));
                let cap = f.div_ceil(n);
                assert!(
                    loads(&owners).values().all(|&l| l <= cap),
                    "{f} flows, {n} instances"
                );
                // The same answer whatever order the flows and instances come in.
                let mut reversed = flows.clone();
                reversed.reverse();
                let other: HashSet<String> = names("i", n).into_iter().rev().collect();
                assert_eq!(Leases::assign(&reversed, &other), owners);
            }
        }
    }

    #[test]
    fn an_instance_joining_or_leaving_moves_few_flows() {
        let flows = names("orders-", 60);
        for n in 2..6 {
            let before: HashSet<String> = names("i", n).into_iter().collect();
            let after: HashSet<String> = names("i", n + 1).into_iter().collect();
            let a = Leases::assign(&flows, &before);
            let b = Leases::assign(&flows, &after);
            let moved = flows
                .iter()
                .filter(|f| a[f.as_str()] != b[f.as_str()])
                .count();
            // The newcomer's share must move to it; bounded loads may move
            // a few more, never a reshuffle.
            let share = flows.len().div_ceil(n + 1);
            assert!(moved >= flows.len() / (n + 1), "{moved} moved joining {n}");
            assert!(
                moved <= 2 * share,
                "{moved} of {} moved when instance {n} joined",
                flows.len()
            );
            // One leaving: its flows must move; the others' mostly stay.
            let mut gone = after.clone();
            gone.remove("i0");
            let c = Leases::assign(&flows, &gone);
            let orphaned = flows.iter().filter(|f| b[f.as_str()] == "i0").count();
            let moved = flows
                .iter()
                .filter(|f| b[f.as_str()] != c[f.as_str()])
                .count();
            assert!(moved >= orphaned);
            assert!(
                moved <= 2 * flows.len().div_ceil(n),
                "{moved} moved when i0 left {}",
                n + 1
            );
        }
    }
}
