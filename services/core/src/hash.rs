//! Deterministic hashing: the approval job hash and the retry jitter.

use sha2::{Digest, Sha256};

use crate::records::JobRequest;

/// Labels with this prefix may change without invalidating an approval.
pub const APPROVAL_LABEL_PREFIX: &str = "approval_";

/// SHA-256 (hex) of the canonical encoding of the request without `approval_*` labels
/// (SPEC §6). The canonical encoding is the request's JSON with fields in declaration order
/// and maps in key order, which is stable across processes and releases; adding a field to
/// `JobRequest` changes hashes, so pending approvals must be re-requested after such an
/// upgrade (documented in docs/schema-evolution.md).
///
/// `traceparent` is left out: it says who traced the submission, not what the job is (a
/// resubmission under another trace is the same job), and hashes stay what they were
/// before the field existed. `not_before` (and the dependencies) count only when set (a job's time is part of what
/// it is), so the hash of a job without one is what it was before the field existed.
pub fn job_hash(request: &JobRequest) -> String {
    let mut sha = ShaWriter(Sha256::new());
    serde_json::to_writer(&mut sha, &Hashed(request))
        .unwrap_or_else(|e| unreachable!("request serializes: {e}"));
    hex(&sha.0.finalize())
}

/// What [`job_hash`] hashes: the request as its JSON has it, field by field, without the
/// `approval_*` labels and without `traceparent`, written straight into the digest (no
/// copy of the request, no JSON text kept: the payload of a large job is hashed once).
struct Hashed<'a>(&'a JobRequest);

impl serde::Serialize for Hashed<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // Every field named, none elided: a field added to the request does not compile
        // here until it is hashed (or left out on purpose, as the trace context is).
        let JobRequest {
            job_id,
            topic,
            tenant_id,
            principal_id,
            priority,
            labels,
            env,
            payload,
            budget,
            meta,
            workflow_id,
            step_index,
            compensation,
            submitted_at,
            traceparent: _,
            not_before,
            depends_on,
            dependency_condition,
            dependency_timeout_ms,
            batch_id,
            batch_size,
            after_batch,
            // Set by the scheduler when a callback is released, after any approval.
            batch_outcome: _,
        } = self.0;
        let mut st = s.serialize_struct("JobRequest", 14)?;
        st.serialize_field("job_id", job_id)?;
        st.serialize_field("topic", topic)?;
        st.serialize_field("tenant_id", tenant_id)?;
        st.serialize_field("principal_id", principal_id)?;
        st.serialize_field("priority", priority)?;
        st.serialize_field("labels", &HashedLabels(labels))?;
        st.serialize_field("env", env)?;
        st.serialize_field("payload", &Bytes(payload))?;
        st.serialize_field("budget", budget)?;
        st.serialize_field("meta", meta)?;
        st.serialize_field("workflow_id", workflow_id)?;
        st.serialize_field("step_index", step_index)?;
        st.serialize_field("compensation", compensation)?;
        st.serialize_field("submitted_at", submitted_at)?;
        if not_before.is_some() {
            st.serialize_field("not_before", not_before)?;
        }
        // Likewise what it waits for.
        if !depends_on.is_empty() {
            st.serialize_field("depends_on", depends_on)?;
            st.serialize_field("dependency_condition", dependency_condition)?;
        }
        if dependency_timeout_ms.is_some() {
            st.serialize_field("dependency_timeout_ms", dependency_timeout_ms)?;
        }
        // Likewise its batch.
        if batch_id.is_some() || batch_size.is_some() {
            st.serialize_field("batch_id", batch_id)?;
            st.serialize_field("batch_size", batch_size)?;
        }
        if after_batch.is_some() {
            st.serialize_field("after_batch", after_batch)?;
        }
        st.end()
    }
}

struct HashedLabels<'a>(&'a std::collections::BTreeMap<String, String>);

impl serde::Serialize for HashedLabels<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(
            self.0
                .iter()
                .filter(|(k, _)| !k.starts_with(APPROVAL_LABEL_PREFIX)),
        )
    }
}

struct Bytes<'a>(&'a [u8]);

impl serde::Serialize for Bytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// Feeds what is written into a SHA-256.
struct ShaWriter(Sha256);

impl std::io::Write for ShaWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// SHA-256 of `bytes`, in hex (what `sha256sum` prints).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 (hex) of arbitrary parts, length-prefixed so boundaries cannot shift.
pub fn sha256_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize())
}

/// Lowercase hex, two digits a byte (what every journaled digest is written as).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// 64-bit FNV-1a: a stable, platform-independent hash for deterministic jitter.
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_writes_every_byte_as_two_lowercase_digits() {
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(super::hex(&all), expected);
        assert_eq!(super::hex(&[]), "");
    }

    use super::*;

    #[test]
    fn approval_labels_do_not_change_the_hash_other_labels_do() {
        let mut r = JobRequest {
            job_id: "j".into(),
            ..Default::default()
        };
        let h0 = job_hash(&r);
        r.labels.insert("approval_ticket".into(), "T-1".into());
        assert_eq!(job_hash(&r), h0);
        r.labels.insert("team".into(), "x".into());
        assert_ne!(job_hash(&r), h0);
        assert_eq!(h0.len(), 64);
    }

    const PINNED: &str = "52e657d8afe5ffecfff1795e5b44011bfe62fee3161f2d35f004c3c79e652922";

    /// Pinned: the hash of a request as ksched computed it before requests had a
    /// `traceparent`; approvals journaled then stay valid, and `audit verify` agrees.
    #[test]
    fn the_trace_context_is_not_part_of_the_hash() {
        let mut r = JobRequest {
            job_id: "j".into(),
            tenant_id: "acme".into(),
            payload: b"p\"traceparent\":null".to_vec(),
            ..Default::default()
        };
        r.labels.insert(",\"traceparent\":null".into(), "x".into());
        let h0 = job_hash(&r);
        assert_eq!(h0, PINNED);
        r.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        assert_eq!(job_hash(&r), h0);
    }

    /// The hash as it was computed before it was streamed: a copy of the request without
    /// approval labels, its whole JSON, the (null) traceparent member cut out (and the null
    /// not_before member, which requests did not have then).
    fn copied_hash(request: &JobRequest) -> String {
        let mut r = request.clone();
        r.labels
            .retain(|k, _| !k.starts_with(APPROVAL_LABEL_PREFIX));
        r.traceparent = None;
        assert_eq!(r.not_before, None);
        assert!(r.depends_on.is_empty() && r.dependency_timeout_ms.is_none());
        let mut json = serde_json::to_vec(&r).unwrap();
        for member in [
            &b",\"batch_outcome\":null"[..],
            b",\"after_batch\":null",
            b",\"batch_size\":null",
            b",\"batch_id\":null",
            b",\"dependency_timeout_ms\":null",
            b",\"dependency_condition\":\"ALL_SUCCEEDED\"",
            b",\"depends_on\":[]",
            b",\"not_before\":null",
            b",\"traceparent\":null",
        ] {
            let at = json
                .windows(member.len())
                .rposition(|w| w == member)
                .unwrap();
            json.drain(at..at + member.len());
        }
        sha256_hex(&json)
    }

    fn text() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("(approval_)?[a-z\"\\\\,:é]{0,6}").unwrap()
    }

    proptest::proptest! {
        /// Streaming the request into the digest gives the hash copying it gave, for any
        /// request: the hashes journaled and approved before stay valid.
        #[test]
        fn the_streamed_hash_is_the_copied_hash(
            job_id in text(),
            tenant in text(),
            principal in proptest::option::of(text()),
            labels in proptest::collection::btree_map(text(), text(), 0..4),
            env in proptest::collection::btree_map(text(), text(), 0..3),
            payload in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            deadline in proptest::option::of(1i64..1_000_000),
            risk in proptest::collection::vec(text(), 0..3),
            workflow in proptest::option::of((text(), 0i32..5)),
            compensation in proptest::option::of(text()),
            traceparent in proptest::option::of(text()),
            submitted_at in proptest::num::i64::ANY,
        ) {
            let mut r = JobRequest {
                job_id,
                tenant_id: tenant,
                principal_id: principal,
                labels,
                env,
                payload,
                submitted_at,
                traceparent,
                ..Default::default()
            };
            r.budget.deadline_ms = deadline;
            r.meta.risk_tags = risk;
            if let Some((w, i)) = workflow {
                r.workflow_id = Some(w);
                r.step_index = Some(i);
            }
            r.compensation = compensation.map(|topic| {
                Box::new(crate::records::JobTemplate {
                    topic,
                    payload: b"undo".to_vec(),
                    ..Default::default()
                })
            });
            proptest::prop_assert_eq!(job_hash(&r), copied_hash(&r));
        }
    }

    #[test]
    fn fnv_is_stable_and_separates_parts() {
        assert_eq!(fnv1a64(&[b"job-1", b"1"]), fnv1a64(&[b"job-1", b"1"]));
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
        // Pinned so a change of the function (and of every replayed backoff) is noticed.
        assert_eq!(fnv1a64(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
