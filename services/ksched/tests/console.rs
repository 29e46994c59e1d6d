//! The operator console (`/ui`, docs/console.md) against `ksched run` on the real broker:
//!
//! - in a real browser: headless Chromium (Debian's `chromium`) driven over WebDriver by
//!   Debian's `chromedriver`, with a small W3C WebDriver client here. It follows jobs from
//!   submit to result, approves one, redrives one from the DLQ, travels back in time, and
//!   writes a screenshot of every page (to `KSCHED_SCREENSHOTS`, default a temp directory);
//! - over plain HTTP: sign-in with an API token, the cookie, roles, and the checks that stop
//!   another site from posting a signed-in browser's forms.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use ksched_core::hash::sha256_hex;
use ksched_core::records::JobRequest;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The W3C WebDriver element key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver with one headless Chromium session.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    shots: PathBuf,
}

impl Browser {
    /// None when Chromium or chromedriver is missing (outside CI, where setup.sh installs
    /// them); the test then says so and does not pass silently under CI=true.
    fn start() -> Option<Browser> {
        let chromium =
            std::env::var("KSCHED_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let driver_bin =
            std::env::var("KSCHED_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let have_driver = Command::new(&driver_bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !have_driver || !std::path::Path::new(&chromium).exists() {
            assert!(
                std::env::var("CI").is_err(),
                "Chromium ({chromium}) and chromedriver ({driver_bin}) are needed (scripts/setup.sh installs them)"
            );
            eprintln!(
                "SKIPPED: no Chromium/chromedriver here (apt-get install chromium chromium-driver)"
            );
            return None;
        }
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        wait_until("chromedriver", 30, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && webdriver("GET", &format!("{base}/status"), None).0 == 200
        });
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1300,1100"]
            }
        }}});
        let (code, v) = webdriver("POST", &format!("{base}/session"), Some(caps));
        assert_eq!(code, 200, "new session: {v}");
        let session = v["value"]["sessionId"].as_str().unwrap().to_owned();
        let shots = std::env::var("KSCHED_SCREENSHOTS")
            .map(PathBuf::from)
            .unwrap_or_else(|_| std::env::temp_dir().join("ksched-console-screenshots"));
        std::fs::create_dir_all(&shots).unwrap();
        Some(Browser {
            driver,
            base,
            session,
            shots,
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let (code, v) = webdriver(method, &url, body);
        assert_eq!(code, 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn go(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    /// The element `css` selects, waiting up to 60 s for it: a click that submits a form
    /// returns before the next page (a replay, on a busy machine) has loaded.
    fn find(&self, css: &str) -> String {
        let url = format!("{}/session/{}/element", self.base, self.session);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (code, v) = webdriver(
                "POST",
                &url,
                Some(json!({"using": "css selector", "value": css})),
            );
            if code == 200 {
                return v["value"][ELEMENT]
                    .as_str()
                    .unwrap_or_else(|| panic!("no element {css}: {v}"))
                    .to_owned();
            }
            let missing = v["value"]["error"] == "no such element";
            assert!(
                missing && Instant::now() < deadline,
                "finding {css}: {code} {v}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn text(&self, css: &str) -> String {
        let e = self.find(css);
        self.call("GET", &format!("/element/{e}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call("POST", &format!("/element/{e}/click"), Some(json!({})));
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call("POST", &format!("/element/{e}/clear"), Some(json!({})));
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn title(&self) -> String {
        self.call("GET", "/title", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn url(&self) -> String {
        self.call("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The page's text, for checks.
    fn body(&self) -> String {
        self.text("body")
    }

    /// Writes a PNG of the page; returns its path.
    fn shot(&self, name: &str) -> PathBuf {
        let b64 = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        webdriver(
            "DELETE",
            &format!("{}/session/{}", self.base, self.session),
            None,
        );
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One WebDriver command: (status, JSON answer); a connection failure is status 0.
fn webdriver(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into();
    let sent = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        ("DELETE", _) => agent.delete(url).call(),
        (_, body) => agent.post(url).send_json(body.unwrap_or_else(|| json!({}))),
    };
    match sent {
        Ok(mut r) => {
            let code = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            (
                code,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        }
        Err(e) => (0, Value::String(e.to_string())),
    }
}

fn produce(p: &BaseProducer, topic: &str, id: &str, labels: &[(&str, &str)]) {
    produce_job(
        p,
        &JobRequest {
            job_id: id.into(),
            topic: topic.into(),
            tenant_id: "acme".into(),
            principal_id: Some("producer".into()),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            payload: format!("payload of {id}").into_bytes(),
            submitted_at: 1,
            ..JobRequest::default()
        },
    );
}

#[test]
fn an_operator_follows_approves_and_redrives_jobs_in_a_real_browser() {
    let Some(b) = Browser::start() else {
        return;
    };
    let rc = RunningScheduler::start("");
    let fixed = Arc::new(Mutex::new(false));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let token = CancellationToken::new();
    let worker = {
        let _guard = rt.enter();
        Worker::new(rc.worker_config("console-worker")).unwrap()
    };
    let (f, t) = (fixed.clone(), token.clone());
    rt.spawn(async move {
        worker
            .run(
                move |job| {
                    let f = f.clone();
                    async move {
                        if job.job_id().starts_with("broken") && !*f.lock().unwrap() {
                            Outcome::fatal("bad_input", "the bug is not fixed yet")
                        } else {
                            Outcome::succeeded()
                        }
                    }
                },
                t,
            )
            .await
    });
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &rc.bootstrap)
        .create()
        .unwrap();
    for id in ["ok-1", "ok-2", "ok-3"] {
        produce(&producer, &rc.job_topic, id, &[]);
    }
    produce(
        &producer,
        &rc.job_topic,
        "needs-approval",
        &[("approval", "required")],
    );
    produce(&producer, &rc.job_topic, "broken-1", &[]);
    producer.flush(Duration::from_secs(10)).unwrap();
    for id in ["ok-1", "ok-2", "ok-3"] {
        wait_state(&rc.api, id, "SUCCEEDED");
    }
    wait_state(&rc.api, "needs-approval", "APPROVAL_REQUIRED");
    wait_state(&rc.api, "broken-1", "FAILED");
    let before_approval = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    std::thread::sleep(Duration::from_millis(1_100));
    let ui = format!("{}/ui", rc.api);

    // Overview: the counts, the tables, the plots (after a few samples).
    std::thread::sleep(Duration::from_millis(4_500));
    b.go(&ui);
    assert_eq!(b.title(), "Overview · ksched");
    assert_eq!(b.text("#count-SUCCEEDED"), "3");
    assert_eq!(b.text("#count-APPROVAL_REQUIRED"), "1");
    assert_eq!(b.text("#count-FAILED"), "1");
    assert!(b.body().contains("bad_input"), "the DLQ reasons show");
    b.find("svg[aria-label='Throughput'] polyline");
    b.find("svg[aria-label='Dead-letter rate'] polyline");
    b.shot("overview");

    // Jobs, filtered; a job's page with its decisions and candidate table.
    b.go(&format!("{ui}/jobs"));
    assert!(b.body().contains("needs-approval"));
    b.shot("jobs");
    b.go(&format!("{ui}/jobs?state=SUCCEEDED"));
    let list = b.text("table");
    assert!(
        list.contains("ok-1") && !list.contains("broken-1"),
        "{list}"
    );
    b.click("a[href='/ui/jobs/ok-1']");
    // Only a job's page has decisions: found once the click's page has loaded.
    let decisions = b.text("#decisions");
    assert!(b.url().ends_with("/ui/jobs/ok-1"), "{}", b.url());
    for expected in [
        "JobAccepted",
        "PolicyEvaluated",
        "JobScheduled",
        "console-worker",
        "JobSucceeded",
    ] {
        assert!(
            decisions.contains(expected),
            "{expected} missing: {decisions}"
        );
    }
    b.find("svg[aria-label='job timeline'] circle");
    b.shot("job");

    // Approve from the job's page.
    b.go(&format!("{ui}/jobs/needs-approval"));
    assert!(b.text("h1").contains("APPROVAL_REQUIRED"));
    b.type_into(
        "form[action$='/approve'] input[name='comment']",
        "looks fine",
    );
    b.shot("approval");
    b.click("form[action$='/approve'] button");
    assert_eq!(b.text("#flash"), "approval sent");
    wait_state(&rc.api, "needs-approval", "SUCCEEDED");
    b.go(&format!("{ui}/jobs/needs-approval"));
    assert!(b.text("h1").contains("SUCCEEDED"));
    assert!(b.text("#decisions").contains("JobApproved"));

    // The DLQ, and a redrive once the bug is fixed.
    b.go(&format!("{ui}/dlq"));
    assert!(b.text("table").contains("broken-1"));
    b.shot("dlq");
    b.click("a[href='/ui/jobs/broken-1']");
    *fixed.lock().unwrap() = true;
    b.type_into(
        "form[action$='/redrive'] input[name='reason']",
        "fixed in v2",
    );
    b.click("form[action$='/redrive'] button");
    let flash = b.text("#flash");
    let new_id = flash
        .strip_prefix("redrive sent as ")
        .unwrap_or_else(|| panic!("{flash}"))
        .to_owned();
    wait_state(&rc.api, &new_id, "SUCCEEDED");
    b.go(&format!("{ui}/jobs/{new_id}"));
    assert!(b.text("h1").contains("SUCCEEDED"));
    assert!(b.body().contains("broken-1 redriven as"));
    b.shot("redriven");

    // Workers, pools and tenants.
    b.go(&format!("{ui}/workers"));
    assert!(b.text("table").contains("console-worker"));
    b.shot("workers");
    b.go(&format!("{ui}/pools"));
    assert!(b.text("table").contains("default"));
    b.shot("pools");

    // Time travel: before the approval, the job still waited for it.
    b.go(&format!("{ui}/at?time={before_approval}"));
    assert!(b.text("#as-of").contains("Replayed to journal offset"));
    let then = b.body();
    assert!(
        then.contains("needs-approval") && then.contains("APPROVAL_REQUIRED"),
        "{then}"
    );
    assert!(!then.contains(&new_id), "the redrive came later");
    b.shot("time-travel");

    // What if approvals had been a denial: the job that waited for one differs.
    b.go(&format!("{ui}/what-if"));
    b.type_into(
        "#policy",
        "package ksched.input\n\ndefault allow := true\n\ndeny contains \"no approvals today\" if input.job.labels.approval == \"required\"\n",
    );
    b.click("#compare");
    let summary = b.text("#what-if-summary");
    assert!(
        summary.contains("would have ended differently"),
        "{summary}"
    );
    let diff = b.text("table");
    assert!(
        diff.contains("needs-approval") && diff.contains("DENIED"),
        "{diff}"
    );
    assert!(!diff.contains("ok-1"), "ok-1 ends the same: {diff}");
    // And how long each tenant's jobs waited in each world.
    let waits = b.text("#what-if-waits");
    assert!(
        waits.contains("acme") && waits.contains(" ms → "),
        "{waits}"
    );
    b.shot("what-if");

    // Everything the console did is in the journal, and replays to the same decisions.
    let (code, out, err) = rc.cli(&["audit", "verify", "-o", "json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["divergences"].as_array().unwrap().len(), 0, "{out}");
    eprintln!("screenshots in {}", b.shots.display());

    token.cancel();
    rt.shutdown_timeout(Duration::from_secs(10));
    rc.stop();
}

const OPERATOR: &str = "olga-0123456789abcdef0123456789ab";
const VIEWER: &str = "victor-0123456789abcdef012345678";

/// Sign-in, roles and the cross-site checks, over HTTP as a browser would send it.
#[test]
fn the_console_signs_in_with_a_token_and_refuses_posts_from_other_sites() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n\
             \x20 - principal: olga\n    token_sha256: {}\n    roles: [operator]\n\
             \x20 - principal: victor\n    token_sha256: {}\n    roles: [viewer]\n",
            sha256_hex(OPERATOR.as_bytes()),
            sha256_hex(VIEWER.as_bytes()),
        ),
    )
    .unwrap();
    let rc = RunningScheduler::start(&format!("  tokens_file: {}\n", tokens.display()));
    let host = rc.api.strip_prefix("http://").unwrap().to_owned();
    let origin = rc.api.clone();
    let form = "application/x-www-form-urlencoded";
    let raw = |method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>| {
        raw_http(&format!("{}{path}", rc.api), method, headers, body)
    };

    // Not signed in: pages send to the sign-in page; posts are refused.
    let (code, head, _) = raw("GET", "/ui/jobs", &[], None);
    assert_eq!(code, 303, "{head}");
    assert!(
        head.contains("location: /ui/login?next=%2fui%2fjobs"),
        "{head}"
    );
    let (code, _, _) = raw(
        "POST",
        "/ui/jobs/x/cancel",
        &[("Content-Type", form), ("Origin", &origin)],
        Some("reason=x"),
    );
    assert_eq!(code, 401);

    // A wrong token is refused; a right one sets an HttpOnly, SameSite=Strict cookie.
    let (code, _, body) = raw(
        "POST",
        "/ui/login",
        &[("Content-Type", form), ("Origin", &origin)],
        Some("token=wrong-0123456789abcdef0123456789&next=%2Fui"),
    );
    assert_eq!(code, 401);
    assert!(body.contains("not accepted"));
    let (code, head, _) = raw(
        "POST",
        "/ui/login",
        &[("Content-Type", form), ("Origin", &origin)],
        Some(&format!("token={OPERATOR}&next=%2Fui%2Fdlq")),
    );
    assert_eq!(code, 303, "{head}");
    assert!(head.contains("location: /ui/dlq"), "{head}");
    assert!(
        head.contains(&format!(
            "set-cookie: ksched_session={OPERATOR}; path=/ui; httponly; samesite=strict"
        )),
        "{head}"
    );
    // Only back to the console's own pages.
    let (_, head, _) = raw(
        "POST",
        "/ui/login",
        &[("Content-Type", form), ("Origin", &origin)],
        Some(&format!("token={OPERATOR}&next=https%3A%2F%2Fevil.example")),
    );
    assert!(
        head.contains("location: /ui\r\n") || head.ends_with("location: /ui"),
        "{head}"
    );

    let cookie = format!("ksched_session={OPERATOR}");
    let (code, _, body) = raw("GET", "/ui/dlq", &[("Cookie", &cookie)], None);
    assert_eq!(code, 200);
    assert!(body.contains("olga"), "signed in as olga");

    // A job to act on.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &rc.bootstrap)
        .create()
        .unwrap();
    produce(
        &producer,
        &rc.job_topic,
        "waiting-1",
        &[("approval", "required")],
    );
    producer.flush(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // The job's state badge, not the word: every page's stylesheet names each state,
        // the 404 page included (this loop once left before the job existed).
        let (code, _, body) = raw("GET", "/ui/jobs/waiting-1", &[("Cookie", &cookie)], None);
        if code == 200 && body.contains("<span class=\"state APPROVAL_REQUIRED\">") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "waiting-1 never waited for approval"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The pools page says what the tenant's waiting job waits for, beside the keys and the
    // fair share tables.
    let (code, _, body) = raw("GET", "/ui/pools", &[("Cookie", &cookie)], None);
    assert_eq!(code, 200);
    for part in [
        "approval_required 1",
        "<h1>Concurrency keys</h1>",
        "<h1>Fair share</h1>",
    ] {
        assert!(body.contains(part), "{part} in {body}");
    }

    // Another site's form, a JSON body, no Origin: refused before anything is sent.
    for (headers, why) in [
        (
            vec![
                ("Content-Type", form),
                ("Origin", "http://evil.example"),
                ("Cookie", &cookie),
            ],
            "cross-origin",
        ),
        (
            vec![("Content-Type", form), ("Cookie", &cookie)],
            "no Origin",
        ),
        (
            vec![
                ("Content-Type", "application/json"),
                ("Origin", &origin),
                ("Cookie", &cookie),
            ],
            "not a form",
        ),
        (
            vec![
                ("Content-Type", form),
                ("Origin", &origin),
                ("Sec-Fetch-Site", "cross-site"),
                ("Cookie", &cookie),
            ],
            "Sec-Fetch-Site",
        ),
    ] {
        let (code, _, _) = raw(
            "POST",
            "/ui/jobs/waiting-1/cancel",
            &headers,
            Some("reason=x"),
        );
        assert_eq!(code, 403, "{why}");
    }
    // A Host this server does not answer to (DNS rebinding).
    let (code, _, _) = raw(
        "GET",
        "/ui",
        &[("Host", "evil.example"), ("Cookie", &cookie)],
        None,
    );
    assert_eq!(code, 400);

    // A viewer sees no buttons and may not act; the operator cancels, as itself.
    let viewer = format!("ksched_session={VIEWER}");
    let (_, _, page) = raw("GET", "/ui/jobs/waiting-1", &[("Cookie", &viewer)], None);
    assert!(!page.contains("/cancel"), "a viewer is offered no cancel");
    let (code, head, _) = raw(
        "POST",
        "/ui/jobs/waiting-1/cancel",
        &[
            ("Content-Type", form),
            ("Origin", &origin),
            ("Cookie", &viewer),
        ],
        Some("reason=x"),
    );
    assert_eq!(code, 303);
    assert!(head.contains("err=victor%20may%20not%20cancel"), "{head}");
    let (code, _, page) = raw("GET", "/ui/jobs/waiting-1", &[("Cookie", &cookie)], None);
    assert!(
        page.contains("/ui/jobs/waiting-1/cancel"),
        "the operator is offered cancel: {code} {}\n{}",
        page.split("<main>").nth(1).unwrap_or(&page),
        rc.log()
    );
    assert!(
        !page.contains("name=\"principal\""),
        "an authenticated caller acts as itself"
    );
    let (code, head, _) = raw(
        "POST",
        "/ui/jobs/waiting-1/cancel",
        &[
            ("Content-Type", form),
            ("Origin", &origin),
            ("Cookie", &cookie),
            ("Host", &host),
        ],
        Some("reason=not+needed&principal=mallory"),
    );
    assert_eq!(code, 303);
    assert!(head.contains("msg=cancel%20sent"), "{head}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, _, body) = raw("GET", "/ui/jobs/waiting-1", &[("Cookie", &cookie)], None);
        if body.contains("cancelled by olga: not needed") {
            break;
        }
        assert!(Instant::now() < deadline, "not cancelled as olga: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Signing out clears the cookie.
    let (code, head, _) = raw(
        "POST",
        "/ui/logout",
        &[
            ("Content-Type", form),
            ("Origin", &origin),
            ("Cookie", &cookie),
        ],
        Some(""),
    );
    assert_eq!(code, 303);
    assert!(head.contains("max-age=0"), "{head}");
    rc.stop();
}

/// An HTTP/1.1 request; (status, lower-cased head, body).
fn raw_http(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String, String) {
    let (status, head, body) = http_full(url, method, headers, body).unwrap();
    (status, head.to_ascii_lowercase(), body)
}
