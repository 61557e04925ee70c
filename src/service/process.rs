//! A process's figures from Linux's `/proc` (none elsewhere): CPU seconds,
//! resident and virtual memory, open and allowed file descriptors, threads
//! and start time. `/metrics` prints this process's as Prometheus's
//! `process_*` family; the load tools read their child server's.

/// What `/proc/<pid>` says about one process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Process {
    /// User and system CPU time.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    /// Unix time the process started.
    pub start_time_seconds: f64,
    pub open_fds: Option<u64>,
    /// The soft limit on open files.
    pub max_fds: Option<u64>,
}

/// USER_HZ, the unit of `/proc`'s CPU and start times: 100 on every Linux
/// architecture this runs on.
const TICKS_PER_SECOND: f64 = 100.0;
/// `/proc`'s page size for `statm`-style counts (`stat` gives RSS in pages).
const PAGE_BYTES: u64 = 4096;

/// Process `pid` (`"self"` for this one), or None where `/proc` is absent.
pub fn of(pid: &str) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command (which may hold spaces and parentheses):
    // state is field 3 of the line, so field n is f[n - 3].
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    Some(Process {
        cpu_seconds: (num(14)? + num(15)?) as f64 / TICKS_PER_SECOND,
        threads: num(20)?,
        start_time_seconds: boot as f64 + num(22)? as f64 / TICKS_PER_SECOND,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)? * PAGE_BYTES,
        open_fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .ok()
            .map(|d| d.count() as u64),
        max_fds: std::fs::read_to_string(format!("/proc/{pid}/limits"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Max open files"))?
                    .split_whitespace()
                    .nth(3)?
                    .parse()
                    .ok()
            }),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_reads_as_itself() {
        let Some(p) = super::of("self") else {
            return; // not Linux
        };
        assert!(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes);
        assert!(p.threads >= 1);
        assert!(p.open_fds.is_some_and(|n| n >= 1));
        assert!(p.max_fds.is_some_and(|n| n >= 1));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started in the last day, not in the future.
        assert!(p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86_400.0);
        let before = p.cpu_seconds;
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(super::of("self").unwrap().cpu_seconds >= before);
    }
}
