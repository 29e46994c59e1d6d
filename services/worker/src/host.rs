//! The host's load, for heartbeats.

pub(crate) struct HostLoad {
    pub(crate) cpu_percent: f64,
    pub(crate) memory_percent: f64,
    pub(crate) memory_free_bytes: Option<i64>,
}

/// CPU (1-minute load average over the CPU count) and memory from /proc, where available.
pub(crate) fn host_load() -> HostLoad {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let load1 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<i64>().ok())
            .map(|kb| kb * 1024)
    };
    let (total, available) = (field("MemTotal:"), field("MemAvailable:"));
    let memory_percent = match (total, available) {
        (Some(t), Some(a)) if t > 0 => 100.0 * (t - a) as f64 / t as f64,
        _ => 0.0,
    };
    HostLoad {
        cpu_percent: (100.0 * load1 / cpus).clamp(0.0, 100.0),
        memory_percent,
        memory_free_bytes: available,
    }
}
