//! What the whole machine, and the scheduler's own threads within this process, spent during
//! a phase of the bench, from Linux's `/proc`: how busy every core was (`/proc/stat`), and for
//! each of this process's threads its CPU time and the time it spent runnable but waiting for
//! a core (`/proc/self/task/*/schedstat`).
//!
//! The bench runs the broker, the scheduler, its workers and the load on one machine. These
//! figures say how much of the machine a phase took and how much of that was the scheduler's
//! own work, so that a reader can tell a scheduler that is slow from a machine that is full.

use std::collections::HashMap;
use std::time::Instant;

/// Thread names (`comm`, at most 15 bytes) of the scheduler's own threads: the processors'
/// deciding, transaction, delivery-report and projection-writing threads, the ticker, the
/// lease, and RocksDB's background threads. Everything else in the process belongs to the
/// bench's harness (the load, the tailer, the SDK workers on tokio) or to librdkafka, whose
/// threads (`rdk:*`) serve every client alike and cannot be told apart by name.
fn is_scheduler_thread(comm: &str) -> bool {
    comm.starts_with("ksched-") || comm.starts_with("rocksdb:")
}

/// The threads that decide, one per shard (`services/runtime/src/service.rs`).
fn is_deciding_thread(comm: &str) -> bool {
    comm.starts_with("ksched-shard-")
}

/// Jiffies the machine's CPUs spent busy and in all, summed over the CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Jiffies {
    busy: u64,
    total: u64,
}

/// The first line of `/proc/stat` (every CPU summed: user nice system idle iowait irq softirq
/// steal ...) and the number of `cpuN` lines. Idle and iowait are idle; the rest is busy.
/// Guest time is already counted in user time, so it is not added again.
fn parse_proc_stat(text: &str) -> Option<(Jiffies, usize)> {
    let mut lines = text.lines();
    let first = lines.next()?;
    let mut fields = first.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v[4];
    let cores = lines
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    Some((
        Jiffies {
            busy: total - idle,
            total,
        },
        cores.max(1),
    ))
}

/// A thread's `schedstat`: nanoseconds on a CPU, nanoseconds runnable and waiting for one,
/// and the number of time slices.
fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace();
    let cpu = f.next()?.parse().ok()?;
    let wait = f.next()?.parse().ok()?;
    Some((cpu, wait))
}

/// One thread's totals so far.
#[derive(Debug, Clone, Copy)]
struct ThreadTotals {
    scheduler: bool,
    deciding: bool,
    cpu_ns: u64,
    wait_ns: u64,
}

/// The machine's and this process's threads' totals at one moment.
pub(super) struct Reading {
    at: Instant,
    machine: Option<(Jiffies, usize)>,
    threads: HashMap<String, ThreadTotals>,
}

/// Reads the totals now; what Linux does not say is left out (and the figures that need it
/// are not reported).
pub(super) fn read() -> Reading {
    let machine = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_proc_stat(&t));
    let mut threads = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for task in dir.flatten() {
            let path = task.path();
            let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
                continue;
            };
            let Some((cpu_ns, wait_ns)) = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|t| parse_schedstat(&t))
            else {
                continue;
            };
            let comm = comm.trim_end();
            threads.insert(
                task.file_name().to_string_lossy().into_owned(),
                ThreadTotals {
                    scheduler: is_scheduler_thread(comm),
                    deciding: is_deciding_thread(comm),
                    cpu_ns,
                    wait_ns,
                },
            );
        }
    }
    Reading {
        at: Instant::now(),
        machine,
        threads,
    }
}

/// The machine and the scheduler's threads over a phase, each as a mean number of cores
/// (CPU seconds per second of the phase).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct Usage {
    pub seconds: f64,
    /// CPUs of the machine.
    pub cores: usize,
    /// Every process on the machine: the broker, the scheduler, the harness, anything else.
    pub busy_cores: f64,
    /// The scheduler's own threads (deciding, transactions, delivery reports, the projection
    /// writer, RocksDB's, the ticker, the lease), not librdkafka's.
    pub scheduler_cores: f64,
    /// The deciding threads: on a core, and runnable but waiting for one.
    pub deciding_cores: f64,
    pub deciding_waiting_cores: f64,
}

impl Usage {
    /// Between two readings, or `None` where `/proc` gave nothing to compare.
    pub(super) fn between(a: &Reading, b: &Reading) -> Option<Usage> {
        let seconds = b.at.duration_since(a.at).as_secs_f64();
        let ((m0, cores), (m1, _)) = (a.machine?, b.machine?);
        let total = m1.total.checked_sub(m0.total).filter(|t| *t > 0)?;
        let busy = m1.busy.saturating_sub(m0.busy);
        let (mut scheduler, mut deciding, mut waiting) = (0u64, 0u64, 0u64);
        // A thread that started meanwhile counts from zero; one that ended is not seen in
        // `b`, and its last stretch is lost (the scheduler's threads live for its lifetime).
        for (tid, t1) in &b.threads {
            let (cpu0, wait0) = a
                .threads
                .get(tid)
                .map_or((0, 0), |t0| (t0.cpu_ns, t0.wait_ns));
            let cpu = t1.cpu_ns.saturating_sub(cpu0);
            let wait = t1.wait_ns.saturating_sub(wait0);
            if t1.scheduler {
                scheduler += cpu;
            }
            if t1.deciding {
                deciding += cpu;
                waiting += wait;
            }
        }
        let cores_of = |ns: u64| ns as f64 / 1e9 / seconds.max(1e-9);
        Some(Usage {
            seconds,
            cores,
            busy_cores: cores as f64 * busy as f64 / total as f64,
            scheduler_cores: cores_of(scheduler),
            deciding_cores: cores_of(deciding),
            deciding_waiting_cores: cores_of(waiting),
        })
    }

    /// How full the machine was and how long the deciding threads waited for a core, for
    /// a latency level.
    pub(super) fn level_figures(&self) -> String {
        format!(
            "busy {:.2} of {} cores; the scheduler's threads {:.2} cores, of which deciding {:.2}, which waited for a core {:.0} ms per second",
            self.busy_cores,
            self.cores,
            self.scheduler_cores,
            self.deciding_cores,
            1000.0 * self.deciding_waiting_cores
        )
    }

    /// CPU per job of the whole machine and of the scheduler's own threads, microseconds.
    pub(super) fn per_job_us(&self, jobs: u64) -> (f64, f64) {
        let per = |cores: f64| 1e6 * cores * self.seconds / jobs.max(1) as f64;
        (per(self.busy_cores), per(self.scheduler_cores))
    }

    /// The jobs/s this machine could carry at most if the scheduler's own threads cost
    /// nothing: every core busy with what the rest (the broker, the Kafka clients' threads,
    /// the workers, the load, the tailer) spends per job. An upper bound: it assumes no idle
    /// time at all and that the rest keeps its cost per job at any rate.
    pub(super) fn free_scheduler_ceiling(&self, jobs: u64) -> Option<f64> {
        let (machine, scheduler) = self.per_job_us(jobs);
        let rest = machine - scheduler;
        (rest > 0.0).then(|| self.cores as f64 * 1e6 / rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 40 3 2 0 7 0\n\
                        cpu0 50 2 25 400 20 2 1 0 0 0\n\
                        cpu1 50 3 25 400 20 1 1 0 0 0\n\
                        intr 12345\n\
                        ctxt 999\n";

    #[test]
    fn proc_stat_counts_idle_and_iowait_as_idle_and_the_cpus_by_their_lines() {
        let (j, cores) = parse_proc_stat(STAT).unwrap();
        // user nice system idle iowait irq softirq steal: guest (7) is inside user already.
        assert_eq!(j.total, 100 + 5 + 50 + 800 + 40 + 3 + 2);
        assert_eq!(j.busy, 100 + 5 + 50 + 3 + 2);
        assert_eq!(cores, 2);
        assert_eq!(parse_proc_stat("intr 1\n"), None);
        assert_eq!(parse_proc_stat("cpu 1 2 x 4 5\n"), None);
    }

    #[test]
    fn schedstat_gives_cpu_and_wait() {
        assert_eq!(parse_schedstat("123456 7890 42\n"), Some((123_456, 7_890)));
        assert_eq!(parse_schedstat("123456\n"), None);
    }

    #[test]
    fn the_scheduler_is_told_from_the_harness_by_thread_name() {
        for ours in [
            "ksched-shard-0",
            "ksched-writer",
            "ksched-txn-call",
            "rocksdb:low",
        ] {
            assert!(is_scheduler_thread(ours), "{ours}");
        }
        // The bench's main thread and the tailer it spawns carry the binary's name; the
        // workers run on tokio; librdkafka's threads serve every client.
        for theirs in ["ksched", "tokio-runtime-w", "rdk:broker1", "rdk:main"] {
            assert!(!is_scheduler_thread(theirs), "{theirs}");
        }
        assert!(is_deciding_thread("ksched-shard-3"));
        assert!(!is_deciding_thread("ksched-writer"));
    }

    fn reading(at: Instant, busy: u64, total: u64, threads: &[(&str, &str, u64, u64)]) -> Reading {
        Reading {
            at,
            machine: Some((Jiffies { busy, total }, 2)),
            threads: threads
                .iter()
                .map(|(tid, comm, cpu_ns, wait_ns)| {
                    (
                        (*tid).to_owned(),
                        ThreadTotals {
                            scheduler: is_scheduler_thread(comm),
                            deciding: is_deciding_thread(comm),
                            cpu_ns: *cpu_ns,
                            wait_ns: *wait_ns,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn usage_is_the_difference_as_cores_and_a_new_thread_counts_from_zero() {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(2);
        let a = reading(
            t0,
            1_000,
            4_000,
            &[
                ("1", "ksched-shard-0", 1_000_000_000, 500_000_000),
                ("2", "ksched", 7_000_000_000, 0),
            ],
        );
        let b = reading(
            t1,
            1_300,
            4_400,
            &[
                ("1", "ksched-shard-0", 1_800_000_000, 1_700_000_000),
                ("2", "ksched", 9_000_000_000, 0),
                ("3", "ksched-writer", 400_000_000, 100_000_000),
            ],
        );
        let u = Usage::between(&a, &b).unwrap();
        assert!((u.seconds - 2.0).abs() < 1e-9);
        assert!((u.busy_cores - 2.0 * 300.0 / 400.0).abs() < 1e-9);
        // 0.8 s of the deciding thread and 0.4 s of the new writer, over 2 s.
        assert!((u.scheduler_cores - 0.6).abs() < 1e-9);
        assert!((u.deciding_cores - 0.4).abs() < 1e-9);
        assert!((u.deciding_waiting_cores - 0.6).abs() < 1e-9);
        let no_machine = Reading {
            machine: None,
            ..reading(t1, 0, 0, &[])
        };
        assert!(Usage::between(&a, &no_machine).is_none());
    }

    #[test]
    fn the_ceiling_is_the_cores_over_what_the_rest_costs_per_job() {
        let u = Usage {
            seconds: 5.0,
            cores: 2,
            busy_cores: 1.8,
            scheduler_cores: 0.6,
            deciding_cores: 0.4,
            deciding_waiting_cores: 0.3,
        };
        // 50,000 jobs in 5 s: the machine 180 us per job, the scheduler 60, the rest 120.
        let (machine, scheduler) = u.per_job_us(50_000);
        assert!((machine - 180.0).abs() < 1e-9);
        assert!((scheduler - 60.0).abs() < 1e-9);
        let ceiling = u.free_scheduler_ceiling(50_000).unwrap();
        assert!((ceiling - 2e6 / 120.0).abs() < 1e-6);
        let all_scheduler = Usage {
            scheduler_cores: 1.8,
            ..u
        };
        assert_eq!(all_scheduler.free_scheduler_ceiling(50_000), None);
    }
}
