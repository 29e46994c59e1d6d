//! The console's HTML: one layout, escaping, tables and forms. Server-rendered; the pages
//! work without JavaScript (the overview's live numbers are the one enhancement).

use std::fmt::Write as _;

use crate::auth::Identity;

/// `s` escaped for HTML text and attribute values: nothing a producer writes (job ids,
/// labels, error messages) becomes markup.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// `s` for a URL path segment or query value.
pub(super) fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// A broker time (ms) as UTC text; empty for none.
pub(super) fn time(ms: Option<i64>) -> String {
    ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_default()
}

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2433;background:#f6f7f9}
header{background:#1d2433;color:#fff;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center}
header a{color:#cfd8ea;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .who{margin-left:auto;color:#9aa6bd}
main{padding:1em 1.2em;max-width:1400px}
h1{font-size:1.3em;margin:.2em 0 .6em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;margin:.3em 0 1em;font-size:13px}
th,td{border:1px solid #dde1e8;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;flex-wrap:wrap;gap:.8em}.card{background:#fff;border:1px solid #dde1e8;padding:.6em .9em;min-width:11em}
.card b{display:block;font-size:1.5em}.muted{color:#6b7488}
.state{padding:0 .4em;border-radius:3px;font-size:12px;font-weight:600;background:#e3e7ee}
.SUCCEEDED{background:#d7f0dc}.FAILED,.TIMEOUT,.DENIED{background:#f6d6d6}.RUNNING,.DISPATCHED,.SCHEDULED{background:#dbe7fb}
.APPROVAL_REQUIRED,.BLOCKED{background:#fbeccb}.CANCELLED{background:#e6e6e6}
form.inline{display:inline-block;margin:0 .4em .4em 0;background:#fff;border:1px solid #dde1e8;padding:.4em}
input,button,select{font:inherit}button{cursor:pointer}
.flash{background:#fff6d6;border:1px solid #e9d48b;padding:.5em .8em;margin-bottom:1em}
.error{background:#fbe0e0;border-color:#e4a3a3}
svg{background:#fff;border:1px solid #dde1e8}
"#;

/// Live numbers on the overview: the server sends the stats block again every few seconds.
const LIVE: &str = r#"<script>
if (window.EventSource) {
  const s = new EventSource('/ui/live');
  s.addEventListener('overview', e => {
    const el = document.getElementById('live');
    if (el) { el.outerHTML = e.data; }
  });
}
</script>"#;

/// The pages of the navigation bar: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/ui", "Overview"),
    ("/ui/jobs", "Jobs"),
    ("/ui/schedules", "Schedules"),
    ("/ui/batches", "Batches"),
    ("/ui/workers", "Workers"),
    ("/ui/pools", "Pools & tenants"),
    ("/ui/dlq", "DLQ"),
    ("/ui/at", "Time travel"),
    ("/ui/what-if", "What if"),
];

/// A whole page: the navigation (`active` marked), who is signed in, and `body`.
pub(super) fn page(title: &str, active: &str, who: Option<&Identity>, body: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        let on = if *path == active { " class=\"on\"" } else { "" };
        let _ = write!(nav, "<a href=\"{path}\"{on}>{label}</a>");
    }
    let who = match who.map(|w| &w.principal) {
        None => String::new(),
        Some(Some(p)) => format!(
            "{} <form method=\"post\" action=\"/ui/logout\" style=\"display:inline\"><button>Sign out</button></form>",
            esc(p)
        ),
        Some(None) => "local (no authentication; loopback only)".to_owned(),
    };
    let live = if active == "/ui" { LIVE } else { "" };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · ksched</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head>\
         <body><header><strong>ksched</strong>{nav}<span class=\"who\">{who}</span></header>\
         <main>{body}</main>{live}</body></html>",
        esc(title)
    )
}

/// A table; cells are HTML already (escape what is text).
pub(super) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = String::from("<table><thead><tr>");
    for h in headers {
        let _ = write!(t, "<th>{}</th>", esc(h));
    }
    t.push_str("</tr></thead><tbody>");
    for r in rows {
        t.push_str("<tr>");
        for c in r {
            let _ = write!(t, "<td>{c}</td>");
        }
        t.push_str("</tr>");
    }
    if rows.is_empty() {
        let _ = write!(
            t,
            "<tr><td colspan=\"{}\" class=\"muted\">none</td></tr>",
            headers.len()
        );
    }
    t.push_str("</tbody></table>");
    t
}

/// A job's state as a badge.
pub(super) fn state(s: &str) -> String {
    format!("<span class=\"state {0}\">{0}</span>", esc(s))
}

/// A link to a job's page.
pub(super) fn job_link(id: &str) -> String {
    format!("<a href=\"/ui/jobs/{}\">{}</a>", url(id), esc(id))
}

/// A POST form with one button; `fields` are (name, label, value) text inputs.
pub(super) fn action_form(action: &str, button: &str, fields: &[(&str, &str, &str)]) -> String {
    let mut f = format!(
        "<form class=\"inline\" method=\"post\" action=\"{}\">",
        esc(action)
    );
    for (name, label, value) in fields {
        let _ = write!(
            f,
            "<label>{} <input name=\"{}\" value=\"{}\" size=\"18\"></label> ",
            esc(label),
            esc(name),
            esc(value)
        );
    }
    let _ = write!(f, "<button type=\"submit\">{}</button></form>", esc(button));
    f
}

/// A notice at the top of a page (`?msg=` after an action, or an error).
pub(super) fn flash(msg: &str, error: bool) -> String {
    if msg.is_empty() {
        return String::new();
    }
    let class = if error { "flash error" } else { "flash" };
    format!("<div class=\"{class}\" id=\"flash\">{}</div>", esc(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_text_never_becomes_markup() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(esc("a\u{1b}[31mb"), "a\u{fffd}[31mb");
        assert_eq!(url("a b/c?d&é"), "a%20b%2Fc%3Fd%26%C3%A9");
        assert_eq!(
            job_link("<x>"),
            "<a href=\"/ui/jobs/%3Cx%3E\">&lt;x&gt;</a>"
        );
        assert_eq!(
            state("\"><img>"),
            "<span class=\"state &quot;&gt;&lt;img&gt;\">&quot;&gt;&lt;img&gt;</span>"
        );
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(time(Some(0)), "1970-01-01 00:00:00.000");
        assert_eq!(time(None), "");
    }
}
