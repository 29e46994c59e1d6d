//! Avro schema resolution (writer schema -> reader schema) over decoded values.
//!
//! apache-avro picks the reader branch of a union by trying each named branch until the value
//! fits, which can pick the wrong record when two records have compatible fields. The Avro
//! specification matches named types by name; this module does that, and otherwise follows the
//! specification's rules: reader fields missing from the writer take their defaults, writer
//! fields unknown to the reader are dropped, enum symbols match by name (falling back to the
//! reader's default), and numeric promotions int -> long -> float -> double apply.

use std::collections::HashMap;

use apache_avro::{
    Schema,
    schema::{Name, RecordSchema, UnionSchema},
    types::Value,
};
use serde_json::Value as Json;

/// Named types of a self-contained schema, by full name, so `Ref`s can be followed.
#[derive(Debug, Default)]
pub(crate) struct Names<'a> {
    by_name: HashMap<String, &'a Schema>,
}

impl<'a> Names<'a> {
    pub(crate) fn of(schema: &'a Schema) -> Names<'a> {
        let mut names = Names::default();
        names.collect(schema);
        names
    }

    fn collect(&mut self, schema: &'a Schema) {
        match schema {
            Schema::Record(r) => {
                self.by_name.insert(r.name.fullname(None), schema);
                for f in &r.fields {
                    self.collect(&f.schema);
                }
            }
            Schema::Enum(e) => {
                self.by_name.insert(e.name.fullname(None), schema);
            }
            Schema::Fixed(f) => {
                self.by_name.insert(f.name.fullname(None), schema);
            }
            Schema::Array(a) => self.collect(&a.items),
            Schema::Map(m) => self.collect(&m.types),
            Schema::Union(u) => {
                for v in u.variants() {
                    self.collect(v);
                }
            }
            _ => {}
        }
    }

    pub(crate) fn deref<'s>(&self, schema: &'s Schema) -> Result<&'s Schema, String>
    where
        'a: 's,
    {
        match schema {
            Schema::Ref { name } => self
                .by_name
                .get(&name.fullname(None))
                .copied()
                .ok_or_else(|| format!("reference to undefined type {}", name.fullname(None))),
            other => Ok(other),
        }
    }
}

fn name_of(schema: &Schema) -> Option<&Name> {
    match schema {
        Schema::Record(r) => Some(&r.name),
        Schema::Enum(e) => Some(&e.name),
        Schema::Fixed(f) => Some(&f.name),
        Schema::Ref { name } => Some(name),
        _ => None,
    }
}

/// The "kind" used to match unnamed union branches.
fn kind(schema: &Schema) -> &'static str {
    match schema {
        Schema::Null => "null",
        Schema::Boolean => "boolean",
        Schema::Int | Schema::Date | Schema::TimeMillis => "int",
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long",
        Schema::Float => "float",
        Schema::Double => "double",
        Schema::Bytes | Schema::Decimal(_) | Schema::BigDecimal => "bytes",
        Schema::String | Schema::Uuid(_) => "string",
        Schema::Array(_) => "array",
        Schema::Map(_) => "map",
        Schema::Union(_) => "union",
        Schema::Record(_) | Schema::Ref { .. } => "record",
        Schema::Enum(_) => "enum",
        Schema::Fixed(_) | Schema::Duration(_) => "fixed",
    }
}

/// Can a writer value of kind `w` be read as kind `r` (same kind or a promotion)?
fn promotable(w: &str, r: &str) -> bool {
    w == r
        || matches!(
            (w, r),
            ("int", "long" | "float" | "double")
                | ("long", "float" | "double")
                | ("float", "double")
                | ("string", "bytes")
                | ("bytes", "string")
        )
}

/// Resolves `value`, decoded with `writer`, into the shape of `reader`.
pub(crate) struct Resolver<'w, 'r> {
    pub(crate) writer_names: &'w Names<'w>,
    pub(crate) reader_names: &'r Names<'r>,
}

impl Resolver<'_, '_> {
    pub(crate) fn resolve(
        &self,
        value: Value,
        writer: &Schema,
        reader: &Schema,
    ) -> Result<Value, String> {
        let writer = self.writer_names.deref(writer)?;
        let reader = self.reader_names.deref(reader)?;
        match (writer, reader) {
            (Schema::Union(w), Schema::Union(r)) => {
                let Value::Union(i, inner) = value else {
                    return Err("expected a union value".into());
                };
                let wb = w
                    .variants()
                    .get(i as usize)
                    .ok_or_else(|| format!("union branch {i} out of range"))?;
                let (j, rb) = self.match_branch(wb, r)?;
                Ok(Value::Union(
                    j as u32,
                    Box::new(self.resolve(*inner, wb, rb)?),
                ))
            }
            (Schema::Union(w), _) => {
                let Value::Union(i, inner) = value else {
                    return Err("expected a union value".into());
                };
                let wb = w
                    .variants()
                    .get(i as usize)
                    .ok_or_else(|| format!("union branch {i} out of range"))?;
                self.resolve(*inner, wb, reader)
            }
            (_, Schema::Union(r)) => {
                let (j, rb) = self.match_branch(writer, r)?;
                Ok(Value::Union(
                    j as u32,
                    Box::new(self.resolve(value, writer, rb)?),
                ))
            }
            (Schema::Record(w), Schema::Record(r)) => self.record(value, w, r),
            (Schema::Enum(w), Schema::Enum(r)) => {
                let Value::Enum(_, symbol) = value else {
                    return Err(format!("expected an enum value for {}", w.name));
                };
                if let Some(pos) = r.symbols.iter().position(|s| *s == symbol) {
                    return Ok(Value::Enum(pos as u32, symbol));
                }
                match &r.default {
                    Some(d) => {
                        let pos = r.symbols.iter().position(|s| s == d).unwrap_or(0);
                        Ok(Value::Enum(pos as u32, d.clone()))
                    }
                    None => Err(format!(
                        "enum {} has no symbol {symbol} and no default",
                        r.name
                    )),
                }
            }
            (Schema::Array(w), Schema::Array(r)) => match value {
                Value::Array(items) => Ok(Value::Array(
                    items
                        .into_iter()
                        .map(|v| self.resolve(v, &w.items, &r.items))
                        .collect::<Result<_, _>>()?,
                )),
                _ => Err("expected an array value".into()),
            },
            (Schema::Map(w), Schema::Map(r)) => match value {
                Value::Map(items) => Ok(Value::Map(
                    items
                        .into_iter()
                        .map(|(k, v)| Ok((k, self.resolve(v, &w.types, &r.types)?)))
                        .collect::<Result<_, String>>()?,
                )),
                _ => Err("expected a map value".into()),
            },
            (w, r) => primitive(value, kind(w), r),
        }
    }

    fn match_branch<'u>(
        &self,
        writer: &Schema,
        reader: &'u UnionSchema,
    ) -> Result<(usize, &'u Schema), String> {
        let writer = self.writer_names.deref(writer)?;
        if let Some(wname) = name_of(writer) {
            let wfull = wname.fullname(None);
            for (j, rb) in reader.variants().iter().enumerate() {
                if name_of(rb).is_some_and(|n| n.fullname(None) == wfull) {
                    return Ok((j, rb));
                }
            }
            return Err(format!("reader union has no branch named {wfull}"));
        }
        let wk = kind(writer);
        let exact = reader.variants().iter().enumerate().find(|(_, rb)| {
            name_of(rb).is_none() && kind(rb) == wk && !matches!(rb, Schema::Union(_))
        });
        let promoted = || {
            reader
                .variants()
                .iter()
                .enumerate()
                .find(|(_, rb)| name_of(rb).is_none() && promotable(wk, kind(rb)))
        };
        exact
            .or_else(promoted)
            .ok_or_else(|| format!("reader union has no branch for a {wk}"))
    }

    fn record(&self, value: Value, w: &RecordSchema, r: &RecordSchema) -> Result<Value, String> {
        let Value::Record(fields) = value else {
            return Err(format!("expected a record value for {}", w.name));
        };
        let mut by_name: HashMap<String, Value> = fields.into_iter().collect();
        let mut out = Vec::with_capacity(r.fields.len());
        for rf in &r.fields {
            let resolved = match (by_name.remove(&rf.name), w.lookup.get(&rf.name)) {
                (Some(v), Some(&wi)) => self
                    .resolve(v, &w.fields[wi].schema, &rf.schema)
                    .map_err(|e| format!("{}.{}: {e}", r.name.name(), rf.name))?,
                _ => match &rf.default {
                    Some(d) => default_value(d, &rf.schema, self.reader_names)
                        .map_err(|e| format!("default of {}.{}: {e}", r.name.name(), rf.name))?,
                    None => {
                        return Err(format!(
                            "field {}.{} is missing from the writer schema and has no default",
                            r.name.name(),
                            rf.name
                        ));
                    }
                },
            };
            out.push((rf.name.clone(), resolved));
        }
        Ok(Value::Record(out))
    }
}

fn primitive(value: Value, writer_kind: &str, reader: &Schema) -> Result<Value, String> {
    let reader_kind = kind(reader);
    if !promotable(writer_kind, reader_kind) {
        return Err(format!("a {writer_kind} cannot be read as a {reader_kind}"));
    }
    let as_i64 = |v: &Value| match v {
        Value::Int(i) | Value::Date(i) | Value::TimeMillis(i) => Some(i64::from(*i)),
        Value::Long(l)
        | Value::TimeMicros(l)
        | Value::TimestampMillis(l)
        | Value::TimestampMicros(l)
        | Value::TimestampNanos(l)
        | Value::LocalTimestampMillis(l)
        | Value::LocalTimestampMicros(l)
        | Value::LocalTimestampNanos(l) => Some(*l),
        _ => None,
    };
    Ok(match (reader, value) {
        (Schema::Null, v @ Value::Null) => v,
        (Schema::Boolean, v @ Value::Boolean(_)) => v,
        (Schema::Int, v @ Value::Int(_)) => v,
        (Schema::Long, v) if as_i64(&v).is_some() => Value::Long(as_i64(&v).unwrap_or_default()),
        (Schema::TimestampMillis, v) if as_i64(&v).is_some() => {
            Value::TimestampMillis(as_i64(&v).unwrap_or_default())
        }
        (Schema::TimestampMicros, v) if as_i64(&v).is_some() => {
            Value::TimestampMicros(as_i64(&v).unwrap_or_default())
        }
        (Schema::Float, v) => match v {
            Value::Float(f) => Value::Float(f),
            other => Value::Float(as_i64(&other).ok_or("expected a number")? as f32),
        },
        (Schema::Double, v) => match v {
            Value::Double(d) => Value::Double(d),
            Value::Float(f) => Value::Double(f64::from(f)),
            other => Value::Double(as_i64(&other).ok_or("expected a number")? as f64),
        },
        (Schema::String, Value::String(s)) => Value::String(s),
        (Schema::String, Value::Bytes(b)) => {
            Value::String(String::from_utf8(b).map_err(|_| "bytes are not UTF-8")?)
        }
        (Schema::Bytes, Value::Bytes(b)) => Value::Bytes(b),
        (Schema::Bytes, Value::String(s)) => Value::Bytes(s.into_bytes()),
        (r, v) => return Err(format!("unsupported resolution of {v:?} to {r:?}")),
    })
}

/// Converts a field's JSON default into a value of the field's schema (Avro spec: a union's
/// default belongs to its first branch; bytes defaults are strings of code points 0-255).
pub(crate) fn default_value(
    json: &Json,
    schema: &Schema,
    names: &Names<'_>,
) -> Result<Value, String> {
    let schema = names.deref(schema)?;
    let wrong = || format!("default {json} does not fit {}", kind(schema));
    Ok(match schema {
        Schema::Null => Value::Null,
        Schema::Boolean => Value::Boolean(json.as_bool().ok_or_else(wrong)?),
        Schema::Int => Value::Int(
            json.as_i64()
                .and_then(|i| i32::try_from(i).ok())
                .ok_or_else(wrong)?,
        ),
        Schema::Long => Value::Long(json.as_i64().ok_or_else(wrong)?),
        Schema::TimestampMillis => Value::TimestampMillis(json.as_i64().ok_or_else(wrong)?),
        Schema::Float => Value::Float(json.as_f64().ok_or_else(wrong)? as f32),
        Schema::Double => Value::Double(json.as_f64().ok_or_else(wrong)?),
        Schema::String => Value::String(json.as_str().ok_or_else(wrong)?.to_owned()),
        Schema::Bytes => Value::Bytes(
            json.as_str()
                .ok_or_else(wrong)?
                .chars()
                .map(|c| u8::try_from(u32::from(c)).map_err(|_| wrong()))
                .collect::<Result<_, _>>()?,
        ),
        Schema::Enum(e) => {
            let s = json.as_str().ok_or_else(wrong)?;
            let pos = e.symbols.iter().position(|x| x == s).ok_or_else(wrong)?;
            Value::Enum(pos as u32, s.to_owned())
        }
        Schema::Array(a) => Value::Array(
            json.as_array()
                .ok_or_else(wrong)?
                .iter()
                .map(|j| default_value(j, &a.items, names))
                .collect::<Result<_, _>>()?,
        ),
        Schema::Map(m) => Value::Map(
            json.as_object()
                .ok_or_else(wrong)?
                .iter()
                .map(|(k, j)| Ok((k.clone(), default_value(j, &m.types, names)?)))
                .collect::<Result<_, String>>()?,
        ),
        Schema::Union(u) => {
            let first = u.variants().first().ok_or("empty union")?;
            Value::Union(0, Box::new(default_value(json, first, names)?))
        }
        Schema::Record(r) => {
            let obj = json.as_object().ok_or_else(wrong)?;
            let mut fields = Vec::with_capacity(r.fields.len());
            for f in &r.fields {
                let v = match (obj.get(&f.name), &f.default) {
                    (Some(j), _) | (None, Some(j)) => default_value(j, &f.schema, names)?,
                    (None, None) => return Err(format!("default lacks field {}", f.name)),
                };
                fields.push((f.name.clone(), v));
            }
            Value::Record(fields)
        }
        other => return Err(format!("defaults of type {other:?} are not supported")),
    })
}
