//! The registry of known writer schemas, by fingerprint, and the current reader schemas.
//!
//! `schemas/` holds one file per named type (`io.ksched.<Name>.avsc`), referencing other types
//! by full name, the layout fastavro's `load_schema` also reads. For each top-level record the
//! registry inlines every referenced definition (at its first use, as Avro's Parsing Canonical
//! Form does) into one self-contained schema; its CRC-64-AVRO (Rabin) fingerprint is what the
//! single-object header carries. `schemas/history/` holds self-contained snapshots of every
//! released version, so records written with an older schema still decode.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};

use apache_avro::{
    Schema, rabin::Rabin, reader::datum::GenericDatumReader, writer::datum::GenericDatumWriter,
};
use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::fast::Plan;
use crate::resolve::Names;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/schemas.rs"));
}

/// The namespace of every ksched schema.
pub const NAMESPACE: &str = "io.ksched";

/// Record types that travel on topics as single-object encoded values.
pub const TOP_LEVEL: &[&str] = &[
    "io.ksched.JobRequest",
    "io.ksched.JobStarted",
    "io.ksched.JobProgress",
    "io.ksched.JobResult",
    "io.ksched.Heartbeat",
    "io.ksched.CancelJob",
    "io.ksched.ApproveJob",
    "io.ksched.RejectJob",
    "io.ksched.Tick",
    "io.ksched.Dispatch",
    "io.ksched.CancelDispatch",
    "io.ksched.DeadLetter",
    "io.ksched.JournalEntry",
    "io.ksched.RedriveJob",
    "io.ksched.RescheduleJob",
    "io.ksched.ScheduleCommand",
];

/// One self-contained schema: a current reader, a historical writer, or both.
pub struct SchemaEntry {
    /// Full name, e.g. `io.ksched.JobRequest`.
    pub name: String,
    /// CRC-64-AVRO fingerprint of the Parsing Canonical Form.
    pub fingerprint: u64,
    /// The self-contained schema JSON (all references inlined).
    pub json: String,
    pub schema: &'static Schema,
    /// The Parsing Canonical Form the fingerprint is computed over.
    pub canonical: String,
    pub(crate) names: Names<'static>,
    pub(crate) writer: GenericDatumWriter<'static>,
    pub(crate) reader: GenericDatumReader<'static>,
    /// The fast decoder's plan, for the current schemas only (the only ones it reads).
    pub(crate) plan: Option<Plan>,
}

impl std::fmt::Debug for SchemaEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaEntry")
            .field("name", &self.name)
            .field("fingerprint", &format_args!("{:016x}", self.fingerprint))
            .finish_non_exhaustive()
    }
}

impl SchemaEntry {
    fn new(name: String, json: String) -> Result<SchemaEntry> {
        let bad = |detail: String| Error::Schema {
            name: name.clone(),
            detail,
        };
        let schema: &'static Schema = Box::leak(Box::new(
            Schema::parse_str(&json).map_err(|e| bad(e.to_string()))?,
        ));
        let plain = without_logical_types(&json).map_err(bad)?;
        let canonical = plain.canonical_form();
        let bytes: [u8; 8] = plain
            .fingerprint::<Rabin>()
            .bytes
            .as_slice()
            .try_into()
            .map_err(|_| bad("Rabin fingerprint is not 8 bytes".into()))?;
        let writer = GenericDatumWriter::builder(schema)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let reader = GenericDatumReader::builder(schema)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(SchemaEntry {
            name,
            fingerprint: u64::from_le_bytes(bytes),
            json,
            schema,
            canonical,
            names: Names::of(schema),
            writer,
            reader,
            plan: None,
        })
    }

    /// The 10-byte single-object header for this schema.
    pub fn header(&self) -> [u8; 10] {
        let mut h = [0u8; 10];
        h[0] = 0xC3;
        h[1] = 0x01;
        h[2..].copy_from_slice(&self.fingerprint.to_le_bytes());
        h
    }
}

/// The schema with logical types removed, for the Parsing Canonical Form and fingerprint.
///
/// apache-avro keeps `{"type":"long"}` for a logical type where the specification's
/// [PRIMITIVES] and [STRIP] rules give `"long"` (as Java and fastavro do), which would change
/// the fingerprint of every schema with a timestamp. Logical types are not part of the
/// canonical form, so they are removed before apache-avro canonicalises.
fn without_logical_types(json: &str) -> std::result::Result<Schema, String> {
    fn strip(node: &mut Json) {
        match node {
            Json::Object(obj) => {
                obj.remove("logicalType");
                obj.values_mut().for_each(strip);
            }
            Json::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value: Json = serde_json::from_str(json).map_err(|e| e.to_string())?;
    strip(&mut value);
    Schema::parse(&value).map_err(|e| e.to_string())
}

/// Known writer schemas by fingerprint and the current reader schema of each top-level record;
/// and, for the Confluent wire format, the schemas learned by Schema Registry id.
pub struct Registry {
    current: HashMap<String, &'static SchemaEntry>,
    by_fingerprint: HashMap<u64, &'static SchemaEntry>,
    learned: RwLock<HashMap<u32, &'static Learned>>,
    source: RwLock<Option<Arc<dyn SchemaSource>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("current", &self.current.len())
            .field("writers", &self.by_fingerprint.len())
            .field("learned_ids", &read(&self.learned).len())
            .finish_non_exhaustive()
    }
}

/// Most Schema Registry ids one process learns: each costs a parsed schema kept for the
/// life of the process, and a hostile producer could otherwise name ids without end.
pub const MAX_LEARNED_IDS: usize = 4096;

/// What a Schema Registry id stands for: one record schema, or a union of records (the
/// TopicNameStrategy subject of a topic that carries several record types); a value
/// written with a union starts with the index of its branch.
#[derive(Debug)]
pub enum Learned {
    Record(&'static SchemaEntry),
    Union(Vec<&'static SchemaEntry>),
}

/// Why a [`SchemaSource`] has no schema for an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// The registry answered: it has no schema with that id (or not an Avro one).
    NotFound(String),
    /// The registry could not be asked (down, timed out, refused the credentials).
    Unavailable(String),
}

/// Where the schemas of unknown Confluent ids come from: a Schema Registry client
/// (`ksched_codec::schema_registry`), installed with [`Registry::set_source`].
pub trait SchemaSource: Send + Sync {
    /// The schema JSON registered under `id`.
    fn schema(&self, id: u32) -> std::result::Result<String, SourceError>;
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Registry {
    /// The registry of the schemas built into this binary.
    pub fn builtin() -> Result<Registry> {
        Registry::from_sources(embedded::CURRENT, embedded::HISTORY, &[])
    }

    /// The built-in registry plus extra self-contained writer schemas (e.g. an older version
    /// kept outside `schemas/history/`).
    pub fn with_extra_writers(extra: &[&str]) -> Result<Registry> {
        Registry::from_sources(embedded::CURRENT, embedded::HISTORY, extra)
    }

    fn from_sources(
        current: &[(&str, &str)],
        history: &[(&str, &str)],
        extra: &[&str],
    ) -> Result<Registry> {
        let definitions = parse_definitions(current)?;
        let mut reg = Registry {
            current: HashMap::new(),
            by_fingerprint: HashMap::new(),
            learned: RwLock::new(HashMap::new()),
            source: RwLock::new(None),
        };
        for &name in TOP_LEVEL {
            let json = inline(name, &definitions)?;
            let mut entry = SchemaEntry::new(name.to_owned(), json)?;
            entry.plan = Plan::compile(entry.schema, &entry.names);
            let entry: &'static SchemaEntry = Box::leak(Box::new(entry));
            reg.current.insert(name.to_owned(), entry);
            reg.by_fingerprint.insert(entry.fingerprint, entry);
        }
        let extra = extra.iter().map(|j| ("extra", *j));
        for (file, json) in history.iter().copied().chain(extra) {
            let value: Json = serde_json::from_str(json).map_err(|e| Error::Schema {
                name: file.to_owned(),
                detail: e.to_string(),
            })?;
            let name = full_name(&value, None).ok_or_else(|| Error::Schema {
                name: file.to_owned(),
                detail: "a history schema must be a named record".into(),
            })?;
            let entry = SchemaEntry::new(name, json.to_owned())?;
            if reg.by_fingerprint.contains_key(&entry.fingerprint) {
                continue;
            }
            let entry: &'static SchemaEntry = Box::leak(Box::new(entry));
            reg.by_fingerprint.insert(entry.fingerprint, entry);
        }
        Ok(reg)
    }

    /// The current schema of a top-level record, e.g. `io.ksched.JobRequest`.
    pub fn current(&self, name: &str) -> Option<&'static SchemaEntry> {
        self.current.get(name).copied()
    }

    /// A known writer schema.
    pub fn writer(&self, fingerprint: u64) -> Option<&'static SchemaEntry> {
        self.by_fingerprint.get(&fingerprint).copied()
    }

    /// Every known writer schema, current ones included.
    pub fn writers(&self) -> impl Iterator<Item = &'static SchemaEntry> + '_ {
        self.by_fingerprint.values().copied()
    }

    /// Reads the header, single-object (`C3 01` + fingerprint) or Confluent (`00` + schema
    /// id, then a union's branch index): the writer schema and the Avro body after it.
    pub fn split<'b>(&self, bytes: &'b [u8]) -> Result<(&'static SchemaEntry, &'b [u8])> {
        if bytes.first() == Some(&CONFLUENT_MAGIC) {
            return self.split_confluent(bytes);
        }
        if bytes.len() < 10 {
            if bytes.len() >= 2 && (bytes[0] != 0xC3 || bytes[1] != 0x01) {
                return Err(Error::BadMagic {
                    found: [bytes[0], bytes[1]],
                });
            }
            return Err(Error::Truncated { len: bytes.len() });
        }
        if bytes[0] != 0xC3 || bytes[1] != 0x01 {
            return Err(Error::BadMagic {
                found: [bytes[0], bytes[1]],
            });
        }
        let mut fp = [0u8; 8];
        fp.copy_from_slice(&bytes[2..10]);
        let fingerprint = u64::from_le_bytes(fp);
        let entry = self
            .writer(fingerprint)
            .ok_or(Error::UnknownFingerprint { fingerprint })?;
        Ok((entry, &bytes[10..]))
    }
}

/// The Confluent wire format's magic byte: `00`, a 4-byte big-endian schema id, the body.
pub const CONFLUENT_MAGIC: u8 = 0;

impl Registry {
    /// Fetches the schemas of unknown Confluent ids from `source` from now on.
    pub fn set_source(&self, source: Arc<dyn SchemaSource>) {
        *write(&self.source) = Some(source);
    }

    /// Whether a schema source is installed.
    pub fn has_source(&self) -> bool {
        read(&self.source).is_some()
    }

    /// Takes `json` as the schema registered under `id`: a named record, or a union of
    /// named records. A schema equal to a known one (same fingerprint) shares its entry.
    pub fn learn(&self, id: u32, json: &str) -> Result<&'static Learned> {
        if let Some(l) = read(&self.learned).get(&id) {
            return Ok(l);
        }
        let bad = |detail: String| Error::Schema {
            name: format!("schema id {id}"),
            detail,
        };
        let value: Json = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let learned = match &value {
            Json::Array(branches) => {
                let mut defs = BTreeMap::new();
                collect_definitions(&value, None, &mut defs);
                let mut entries = Vec::with_capacity(branches.len());
                for b in branches {
                    let name = match b {
                        Json::String(n) => n.clone(),
                        other => full_name(other, None)
                            .ok_or_else(|| bad("a union branch is not a named record".into()))?,
                    };
                    let branch_json = inline(&name, &defs)?;
                    entries.push(self.entry(name, branch_json)?);
                }
                Learned::Union(entries)
            }
            Json::Object(_) => {
                let name = full_name(&value, None)
                    .ok_or_else(|| bad("the schema is not a named record".into()))?;
                Learned::Record(self.entry(name, json.to_owned())?)
            }
            _ => return Err(bad("the schema is neither a record nor a union".into())),
        };
        let mut learned_ids = write(&self.learned);
        if let Some(l) = learned_ids.get(&id) {
            return Ok(l);
        }
        if learned_ids.len() >= MAX_LEARNED_IDS {
            return Err(bad(format!(
                "this process already learned {MAX_LEARNED_IDS} schema ids, the most it keeps"
            )));
        }
        let learned: &'static Learned = Box::leak(Box::new(learned));
        learned_ids.insert(id, learned);
        Ok(learned)
    }

    /// The entry for a learned schema: the known one with the same fingerprint, else new.
    fn entry(&self, name: String, json: String) -> Result<&'static SchemaEntry> {
        let entry = SchemaEntry::new(name, json)?;
        if let Some(known) = self.writer(entry.fingerprint) {
            return Ok(known);
        }
        Ok(Box::leak(Box::new(entry)))
    }

    /// The schema of a Confluent id: learned already, else fetched from the source.
    fn learned(&self, id: u32) -> Result<&'static Learned> {
        if let Some(l) = read(&self.learned).get(&id) {
            return Ok(l);
        }
        let Some(source) = read(&self.source).clone() else {
            return Err(Error::UnknownSchemaId {
                id,
                detail: "no schema registry is configured to look it up".into(),
            });
        };
        match source.schema(id) {
            Ok(json) => self.learn(id, &json),
            Err(SourceError::NotFound(detail)) => Err(Error::UnknownSchemaId { id, detail }),
            Err(SourceError::Unavailable(detail)) => Err(Error::SchemaUnavailable { id, detail }),
        }
    }

    fn split_confluent<'b>(&self, bytes: &'b [u8]) -> Result<(&'static SchemaEntry, &'b [u8])> {
        if bytes.len() < 5 {
            return Err(Error::Truncated { len: bytes.len() });
        }
        let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let body = &bytes[5..];
        match self.learned(id)? {
            Learned::Record(entry) => Ok((entry, body)),
            Learned::Union(branches) => {
                let (index, len) = read_long(body).ok_or_else(|| Error::Malformed {
                    schema: format!("the union of schema id {id}"),
                    detail: "the branch index does not decode".into(),
                })?;
                let entry = usize::try_from(index)
                    .ok()
                    .and_then(|i| branches.get(i))
                    .ok_or_else(|| Error::Malformed {
                        schema: format!("the union of schema id {id}"),
                        detail: format!("branch {index} of a union of {} records", branches.len()),
                    })?;
                Ok((entry, &body[len..]))
            }
        }
    }

    /// Appends `value` in the Confluent wire format: `00`, `id` big-endian, the branch index
    /// when `id` names a union (`branch`), then the body in the current schema of its type,
    /// which must be the schema registered under `id`.
    pub fn encode_confluent_into<T: crate::Record>(
        &self,
        value: &T,
        id: u32,
        branch: Option<u32>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.encode_framed(value, buf, |_, buf| {
            buf.push(CONFLUENT_MAGIC);
            buf.extend_from_slice(&id.to_be_bytes());
            if let Some(b) = branch {
                write_long(i64::from(b), buf);
            }
        })
    }
}

/// Avro's zig-zag varint long: the value and how many bytes it took.
fn read_long(bytes: &[u8]) -> Option<(i64, usize)> {
    let mut n: u64 = 0;
    for (i, b) in bytes.iter().enumerate().take(10) {
        n |= u64::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            #[allow(clippy::cast_possible_wrap)]
            let v = (n >> 1) as i64 ^ -((n & 1) as i64);
            return Some((v, i + 1));
        }
    }
    None
}

fn write_long(v: i64, buf: &mut Vec<u8>) {
    #[allow(clippy::cast_sign_loss)]
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    while n >= 0x80 {
        buf.push((n as u8) | 0x80);
        n >>= 7;
    }
    buf.push(n as u8);
}

/// Every named type defined in `node`, by full name (namespaces inherited as Avro does).
fn collect_definitions(node: &Json, enclosing: Option<&str>, defs: &mut BTreeMap<String, Json>) {
    match node {
        Json::Array(items) => items
            .iter()
            .for_each(|n| collect_definitions(n, enclosing, defs)),
        Json::Object(obj) => {
            let ty = obj.get("type").and_then(Json::as_str).unwrap_or("");
            let mut ns = enclosing.map(str::to_owned);
            if matches!(ty, "record" | "error" | "enum" | "fixed")
                && let Some(full) = full_name(node, enclosing)
            {
                ns = full.rsplit_once('.').map(|(n, _)| n.to_owned());
                defs.entry(full).or_insert_with(|| node.clone());
            }
            for key in ["type", "items", "values"] {
                if let Some(child) = obj.get(key).filter(|c| !c.is_string()) {
                    collect_definitions(child, ns.as_deref(), defs);
                }
            }
            if let Some(fields) = obj.get("fields").and_then(Json::as_array) {
                for f in fields {
                    if let Some(t) = f.get("type") {
                        collect_definitions(t, ns.as_deref(), defs);
                    }
                }
            }
        }
        _ => {}
    }
}

/// The self-contained JSON of a union of top-level records (the TopicNameStrategy subject of
/// a topic carrying several types): each named type defined once, at its first use.
pub fn union_self_contained(names: &[&str]) -> Result<String> {
    let defs = parse_definitions(embedded::CURRENT)?;
    let mut seen = HashSet::new();
    let mut branches = Vec::with_capacity(names.len());
    for name in names {
        let def = defs.get(*name).ok_or_else(|| Error::Schema {
            name: (*name).to_owned(),
            detail: "no such schema in schemas/".into(),
        })?;
        branches.push(
            walk(def, &defs, &mut seen, &mut Vec::new()).map_err(|detail| Error::Schema {
                name: (*name).to_owned(),
                detail,
            })?,
        );
    }
    serde_json::to_string_pretty(&Json::Array(branches)).map_err(|e| Error::Schema {
        name: names.join("|"),
        detail: e.to_string(),
    })
}

/// Parses every `io.ksched.<Name>.avsc` definition, keyed by full name.
fn parse_definitions(files: &[(&str, &str)]) -> Result<BTreeMap<String, Json>> {
    let mut defs = BTreeMap::new();
    for (file, text) in files {
        let json: Json = serde_json::from_str(text).map_err(|e| Error::Schema {
            name: (*file).to_owned(),
            detail: e.to_string(),
        })?;
        let name = full_name(&json, None).ok_or_else(|| Error::Schema {
            name: (*file).to_owned(),
            detail: "expected a named type".into(),
        })?;
        if name != *file {
            return Err(Error::Schema {
                name: (*file).to_owned(),
                detail: format!("file defines {name}; the file must be named {name}.avsc"),
            });
        }
        defs.insert(name, json);
    }
    Ok(defs)
}

fn full_name(json: &Json, enclosing: Option<&str>) -> Option<String> {
    let name = json.get("name")?.as_str()?;
    if name.contains('.') {
        return Some(name.to_owned());
    }
    let ns = json
        .get("namespace")
        .and_then(Json::as_str)
        .or(enclosing)
        .unwrap_or("");
    Some(if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}.{name}")
    })
}

/// Inlines `node`: each named type of `defs` defined at its first use (`seen` says which are
/// already) and referenced by full name afterwards.
fn walk(
    node: &Json,
    defs: &BTreeMap<String, Json>,
    seen: &mut HashSet<String>,
    path: &mut Vec<String>,
) -> std::result::Result<Json, String> {
    match node {
        Json::String(s) => {
            let full = if s.contains('.') || !defs.contains_key(&format!("{NAMESPACE}.{s}")) {
                s.clone()
            } else {
                format!("{NAMESPACE}.{s}")
            };
            match defs.get(&full) {
                Some(def) if !seen.contains(&full) => walk(def, defs, seen, path),
                Some(_) => Ok(Json::String(full)),
                None => Ok(node.clone()),
            }
        }
        Json::Array(branches) => Ok(Json::Array(
            branches
                .iter()
                .map(|b| walk(b, defs, seen, path))
                .collect::<std::result::Result<_, _>>()?,
        )),
        Json::Object(obj) => {
            let mut out = obj.clone();
            let ty = obj.get("type").and_then(Json::as_str).unwrap_or("");
            match ty {
                "record" | "error" | "enum" | "fixed" => {
                    let full =
                        full_name(node, Some(NAMESPACE)).ok_or_else(|| format!("nameless {ty}"))?;
                    if path.contains(&full) {
                        return Err(format!("recursive type {full} is not supported"));
                    }
                    seen.insert(full.clone());
                    out.insert("name".into(), Json::String(full.clone()));
                    out.remove("namespace");
                    if ty == "record" || ty == "error" {
                        path.push(full);
                        let fields = obj
                            .get("fields")
                            .and_then(Json::as_array)
                            .ok_or("record without fields")?;
                        let mut new_fields = Vec::with_capacity(fields.len());
                        for f in fields {
                            let mut f = f.as_object().ok_or("field is not an object")?.clone();
                            let t = f.get("type").ok_or("field without type")?.clone();
                            f.insert("type".into(), walk(&t, defs, seen, path)?);
                            new_fields.push(Json::Object(f));
                        }
                        out.insert("fields".into(), Json::Array(new_fields));
                        path.pop();
                    }
                }
                "array" => {
                    let items = obj.get("items").ok_or("array without items")?;
                    out.insert("items".into(), walk(items, defs, seen, path)?);
                }
                "map" => {
                    let values = obj.get("values").ok_or("map without values")?;
                    out.insert("values".into(), walk(values, defs, seen, path)?);
                }
                _ => {}
            }
            Ok(Json::Object(out))
        }
        other => Ok(other.clone()),
    }
}

/// The self-contained JSON schema of `name`: every referenced named type defined at its first
/// use and referenced by full name afterwards.
pub(crate) fn inline(name: &str, defs: &BTreeMap<String, Json>) -> Result<String> {
    let def = defs.get(name).ok_or_else(|| Error::Schema {
        name: name.to_owned(),
        detail: "no such schema in schemas/".into(),
    })?;
    let mut seen = HashSet::new();
    let json = walk(def, defs, &mut seen, &mut Vec::new()).map_err(|detail| Error::Schema {
        name: name.to_owned(),
        detail,
    })?;
    serde_json::to_string_pretty(&json).map_err(|e| Error::Schema {
        name: name.to_owned(),
        detail: e.to_string(),
    })
}

/// The self-contained current schema JSON of every top-level record, by full name.
pub fn current_self_contained() -> Result<BTreeMap<String, String>> {
    let defs = parse_definitions(embedded::CURRENT)?;
    TOP_LEVEL
        .iter()
        .map(|n| Ok(((*n).to_owned(), inline(n, &defs)?)))
        .collect()
}
