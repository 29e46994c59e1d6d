//! Hostile callers against `ksched run` on the real broker: a what-if whose policy would take
//! the machine's memory, hundreds of clients that never finish their requests, callers with
//! the weakest roles. The scheduler keeps scheduling and answering through all of them.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ksched_core::hash::sha256_hex;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use tokio_util::sync::CancellationToken;

const AUDITOR: &str = "audit-0123456789abcdef0123456789";
const VIEWER: &str = "viewer-0123456789abcdef012345678";
const SCOPED: &str = "scoped-0123456789abcdef012345678";

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn tokens(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.yaml");
    std::fs::write(
        &path,
        format!(
            "tokens:\n\
             \x20 - principal: audrey\n    token_sha256: {}\n    roles: [auditor]\n\
             \x20 - principal: vic\n    token_sha256: {}\n    roles: [viewer]\n\
             \x20 - principal: sam\n    token_sha256: {}\n    roles: [operator]\n    tenants: [acme]\n",
            sha256_hex(AUDITOR.as_bytes()),
            sha256_hex(VIEWER.as_bytes()),
            sha256_hex(SCOPED.as_bytes()),
        ),
    )
    .unwrap();
    path
}

/// A job's state as the auditor sees it.
fn state_of(api: &str, id: &str) -> Option<String> {
    let auth = format!("Bearer {AUDITOR}");
    let (code, body) = http_with(
        &format!("{api}/api/v1/jobs/{id}"),
        "GET",
        &[("Authorization", &auth)],
        None,
    )
    .ok()?;
    (code == 200).then(|| {
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["state"].as_str().unwrap_or("").to_owned()
    })
}

/// A form post from a console page, as a signed-in browser sends it.
fn post_form(api: &str, path: &str, token: &str, form: &str) -> (u16, String) {
    let host = api.strip_prefix("http://").unwrap();
    let origin = format!("http://{host}");
    let auth = format!("Bearer {token}");
    http_with(
        &format!("{api}{path}"),
        "POST",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", &origin),
            ("Authorization", &auth),
        ],
        Some(form),
    )
    .unwrap()
}

fn form_value(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A what-if whose policy would materialize 10^11 numbers (21 GB resident within a minute,
/// unbounded) and one that loops a million times per job: both answer, the scheduler's
/// memory stays where it was, jobs keep being scheduled meanwhile; a viewer may not ask,
/// and a tenant-scoped caller's answer counts its own tenant's jobs only.
#[test]
fn a_what_if_cannot_take_the_schedulers_memory_or_its_jobs() {
    let tdir = tempfile::tempdir().unwrap();
    let c = RunningScheduler::start(&format!(
        "  tokens_file: {}\n  replay_memory_limit_bytes: 1073741824\n  replay_timeout_ms: 120000\n",
        tokens(tdir.path()).display()
    ));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        let mut cfg = c.worker_config("hostile-worker");
        cfg.max_parallel_jobs = 64;
        let worker = Worker::new(cfg).unwrap();
        let t = stop.clone();
        rt.spawn(async move { worker.run(|_| async { Outcome::succeeded() }, t).await });
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &c.bootstrap)
        .create()
        .unwrap();
    // History for the replays: jobs of two tenants.
    for i in 0..40 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        submit_as(&producer, &c.job_topic, &format!("{tenant}-{i}"), tenant);
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_until("the history's jobs to succeed", 60, || {
        state_of(&c.api, "globex-39").as_deref() == Some("SUCCEEDED")
    });

    // Jobs keep flowing while the replays run.
    let flowing = Arc::new(AtomicBool::new(true));
    let done = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (flowing, done) = (flowing.clone(), done.clone());
        let (api, topic, bootstrap) = (c.api.clone(), c.job_topic.clone(), c.bootstrap.clone());
        std::thread::spawn(move || {
            let producer: BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .create()
                .unwrap();
            let mut i = 0;
            while flowing.load(Ordering::Relaxed) {
                let id = format!("during-{i}");
                submit(&producer, &topic, &id);
                producer.flush(Duration::from_secs(10)).unwrap();
                let deadline = Instant::now() + Duration::from_secs(30);
                while state_of(&api, &id).as_deref() != Some("SUCCEEDED") {
                    assert!(Instant::now() < deadline, "{id} was not scheduled in 30 s");
                    std::thread::sleep(Duration::from_millis(50));
                }
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        })
    };

    let pid = c.child.id();
    let before = rss(pid);
    let peak = Arc::new(AtomicU64::new(before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // A viewer may not replay the journal.
    let (code, _) = post_form(
        &c.api,
        "/ui/what-if",
        VIEWER,
        "policy=package+ksched.input%0Aallow+%3A%3D+true&shard=0",
    );
    assert_eq!(code, 403);

    let huge = "package ksched.input\ndefault allow := true\ndeny contains \"x\" if count(numbers.range(1, 100000000000)) > 0\n";
    let looping = "package ksched.input\ndefault allow := true\ndeny contains \"x\" if count([1 | some i in numbers.range(1, 1000); some j in numbers.range(1, 1000)]) > 0\n";
    let completed_before = done.load(Ordering::Relaxed);
    // Each job's evaluation stops at its memory limit (the range) or its step limit (the
    // loop), its verdict says so, and the replay answers.
    for (policy, answer) in [
        (huge, "would have ended differently"),
        (looping, "would have ended differently"),
    ] {
        let started = Instant::now();
        let (code, page) = post_form(
            &c.api,
            "/ui/what-if",
            AUDITOR,
            &format!("policy={}&shard=0", form_value(policy)),
        );
        let took = started.elapsed();
        assert_eq!(code, 200, "{page}");
        assert!(page.contains(answer), "{answer}: {page}");
        assert!(took < Duration::from_secs(120), "{took:?}");
        eprintln!("what-if answered in {took:?}: {answer}");
    }
    let scheduled_meanwhile = done.load(Ordering::Relaxed) - completed_before;
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let grew = peak.load(Ordering::Relaxed).saturating_sub(before);
    eprintln!(
        "scheduler RSS {} MiB before, peak growth {} MiB during the what-ifs; {scheduled_meanwhile} jobs scheduled meanwhile",
        before >> 20,
        grew >> 20
    );
    assert!(
        grew < 256 << 20,
        "the scheduler grew {} MiB during the what-ifs",
        grew >> 20
    );
    assert!(scheduled_meanwhile > 0, "no job was scheduled meanwhile");

    // A tenant-scoped caller's answer covers its own tenant: 20 of the 40 jobs and those
    // submitted during the test, all acme's; globex's appear nowhere.
    let deny_all = "package ksched.input\ndeny contains \"no\" if true\n";
    let (code, page) = post_form(
        &c.api,
        "/ui/what-if",
        SCOPED,
        &format!("policy={}&shard=0", form_value(deny_all)),
    );
    assert_eq!(code, 200, "{page}");
    assert!(!page.contains("globex"), "another tenant's jobs are shown");
    let (_, everyone) = post_form(
        &c.api,
        "/ui/what-if",
        AUDITOR,
        &format!("policy={}&shard=0", form_value(deny_all)),
    );
    let replayed = |page: &str| -> u64 {
        let at = page.find("id=\"what-if-summary\">").unwrap() + "id=\"what-if-summary\">".len();
        page[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(everyone.contains("globex"));
    assert!(
        replayed(&page) + 20 <= replayed(&everyone),
        "scoped {} vs all {}",
        replayed(&page),
        replayed(&everyone)
    );

    flowing.store(false, Ordering::Relaxed);
    feeder.join().unwrap();
    stop.cancel();
}

/// 500 clients that open a connection and send half a request (or a body a byte at a time)
/// do not stop the API from answering others within a second, and are cut off after
/// `http.request_read_timeout_ms`.
#[test]
fn slow_clients_are_cut_off_and_do_not_stop_the_api() {
    let tdir = tempfile::tempdir().unwrap();
    let c = RunningScheduler::start(&format!(
        "  tokens_file: {}\n  request_read_timeout_ms: 3000\n",
        tokens(tdir.path()).display()
    ));
    let addr = c.api.strip_prefix("http://").unwrap().to_owned();
    let mut slow = Vec::new();
    for i in 0..500 {
        let mut s = TcpStream::connect(&addr).unwrap();
        if i % 2 == 0 {
            // Headers that never end.
            write!(s, "GET /api/v1/jobs HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").unwrap();
        } else {
            // A body that never comes.
            write!(
                s,
                "POST /api/v1/jobs/x/cancel HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {SCOPED}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
            )
            .unwrap();
        }
        slow.push(s);
    }
    let auth = format!("Bearer {AUDITOR}");
    for _ in 0..5 {
        let started = Instant::now();
        let (code, _) = http(&format!("{}/health/live", c.api), "GET", None).unwrap();
        assert_eq!(code, 200);
        let (code, body) = http_with(
            &format!("{}/api/v1/jobs", c.api),
            "GET",
            &[("Authorization", &auth)],
            None,
        )
        .unwrap();
        assert_eq!(code, 200, "{body}");
        let took = started.elapsed();
        eprintln!("health + jobs answered in {took:?} beside 500 slow clients");
        assert!(took < Duration::from_secs(1), "{took:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Cut off after the timeout: each connection is closed (perhaps with a 408 first).
    std::thread::sleep(Duration::from_secs(5));
    let mut closed = 0;
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        if s.read_to_end(&mut buf).is_ok() {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 500,
        "every slow connection was closed by the server"
    );
}

/// Every answer says not to sniff, frame or keep it; `/metrics` answers an allowed Host
/// or an address, not another name (DNS rebinding).
#[test]
fn answers_carry_the_security_headers_and_metrics_check_the_host() {
    let c = RunningScheduler::start("");
    let (code, head, _) = http_full(&format!("{}/api/v1/jobs", c.api), "GET", &[], None).unwrap();
    assert_eq!(code, 200);
    let head = head.to_ascii_lowercase();
    for h in [
        "x-content-type-options: nosniff",
        "content-security-policy: frame-ancestors 'none'",
        "cache-control: no-store",
    ] {
        assert!(head.contains(h), "{h} missing: {head}");
    }
    let metrics = format!("{}/metrics", c.api);
    assert_eq!(http(&metrics, "GET", None).unwrap().0, 200);
    let (code, _) = http_with(&metrics, "GET", &[("Host", "evil.example:8080")], None).unwrap();
    assert_eq!(code, 400, "a rebinding name is refused");
    let (code, _) = http_with(&metrics, "GET", &[("Host", "10.1.2.3:8080")], None).unwrap();
    assert_eq!(code, 200, "a scraper addressing the pod by IP is answered");
}

/// A redrive cannot probe another tenant's job ids: a caller held to tenants names new ids
/// in the job's tenant's namespace only, so another tenant's id, taken or not, gets the same
/// answer (400); its own answers 202.
#[test]
fn a_redrive_cannot_probe_another_tenants_job_ids() {
    let tdir = tempfile::tempdir().unwrap();
    let c = RunningScheduler::start(&format!(
        "  tokens_file: {}\n",
        tokens(tdir.path()).display()
    ));
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &c.bootstrap)
        .create()
        .unwrap();
    // Dead-lettered at once: no pool offers what it requires.
    let mut failed = ksched_core::records::JobRequest {
        job_id: "acme:failed".into(),
        topic: c.job_topic.clone(),
        tenant_id: "acme".into(),
        submitted_at: 1,
        ..Default::default()
    };
    failed.meta.requires = vec!["quantum".into()];
    produce_job(&producer, &failed);
    submit_as(&producer, &c.job_topic, "globex:secret", "globex");
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_until("both jobs", 60, || {
        state_of(&c.api, "acme:failed").as_deref() == Some("FAILED")
            && state_of(&c.api, "globex:secret").is_some()
    });
    let redrive = |new_id: &str| {
        let auth = format!("Bearer {SCOPED}");
        http_with(
            &format!("{}/api/v1/jobs/acme:failed/redrive", c.api),
            "POST",
            &[("Authorization", &auth)],
            Some(&format!("{{\"new_job_id\": \"{new_id}\"}}")),
        )
        .unwrap()
    };
    let (existing, body) = redrive("globex:secret");
    assert_eq!(existing, 400, "{body}");
    let (free, free_body) = redrive("globex:unused");
    assert_eq!(free, 400, "{free_body}");
    assert_eq!(
        body.replace("secret", "x"),
        free_body.replace("unused", "x"),
        "the same answer, taken or not"
    );
    let (own, body) = redrive("acme:again");
    assert_eq!(own, 202, "{body}");
}
