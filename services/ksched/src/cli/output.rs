//! Human output: aligned tables and UTC times.

use serde_json::Value;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Aligned columns for people.
    Table,
    /// JSON for scripts.
    Json,
}

/// `s` safe to print on a terminal: control characters (C0 and C1, DEL; an escape
/// sequence starts with one) and the bidirectional overrides that reorder what a reader sees
/// are shown as `\u{..}` escapes. Job ids, labels, error messages and reasons come from
/// producers and workers, any of whom may be hostile.
pub(crate) fn clean(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Prints rows under headers, columns aligned by display width (wide characters count
/// twice), every cell [`clean`]ed.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", render_table(headers, rows));
}

/// [`table`]'s text: comfy-table without borders, two spaces between columns, no trailing
/// blanks.
fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(headers.iter().map(|h| clean(h).into_owned()));
    for r in rows {
        t.add_row(r.iter().map(|c| clean(c).into_owned()));
    }
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let mut out = String::new();
    for line in t.lines() {
        let line = line.trim_end();
        if !line.is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

pub(crate) fn json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// A JSON value as a table cell: strings bare (and [`clean`]), null as "-".
pub(crate) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => clean(s).into_owned(),
        other => other.to_string(),
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm` (UTC).
pub(crate) fn time(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(ts) => ts.strftime("%Y-%m-%d %H:%M:%S%.3f").to_string(),
        // Beyond jiff's range (years -9999..=9999): the number, not a made-up date.
        Err(_) => format!("{ms} ms"),
    }
}

pub(crate) fn time_cell(v: &Value) -> String {
    v.as_i64().map_or_else(|| "-".into(), time)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::time(0), "1970-01-01 00:00:00.000");
        assert_eq!(super::time(1_700_000_000_123), "2023-11-14 22:13:20.123");
        assert_eq!(super::time(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    #[test]
    fn columns_align_by_display_width() {
        let out = super::render_table(
            &["JOB", "STATE"],
            &[
                vec!["日本-1".into(), "RUNNING".into()],
                vec!["ab".into(), "\u{1b}[31mX".into()],
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            ["JOB     STATE", "日本-1  RUNNING", "ab      \\u{1b}[31mX",],
            "{out}"
        );
    }

    #[test]
    fn untrusted_text_cannot_drive_the_terminal() {
        assert_eq!(super::clean("job-1"), "job-1");
        assert_eq!(super::clean("ünïcödé 日本"), "ünïcödé 日本");
        assert_eq!(
            super::clean("a\u{1b}[2J\u{1b}]0;owned\u{7}b"),
            "a\\u{1b}[2J\\u{1b}]0;owned\\u{7}b"
        );
        assert_eq!(super::clean("x\ry\nz\u{9b}"), "x\\u{d}y\\u{a}z\\u{9b}");
        assert_eq!(super::clean("ab\u{202e}cd"), "ab\\u{202e}cd");
        assert_eq!(
            super::cell(&serde_json::json!("\u{1b}[31mred")),
            "\\u{1b}[31mred"
        );
    }
}
