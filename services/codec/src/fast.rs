//! The fast path for records written with the current schema: a serde deserializer driven by
//! a plan compiled once from the schema, reading straight from the bytes.
//!
//! apache-avro's own serde reader, which this replaces on the hot paths (every input the
//! processor reads, every journal entry a replay folds), copies each string and byte field
//! into a freshly zeroed buffer and looks every record field up by name in the schema. Here
//! the fields are walked in schema order, strings and bytes are handed to serde borrowed
//! from the input (copied once, into the value being built), and references to named types
//! are followed by index.
//!
//! It also tells how the bytes were written ([`Form`]): as apache-avro writes them (minimal
//! varints, each array and map in one block, map keys in strictly increasing order), in
//! another valid way (what other Avro libraries write: hamba/avro in Go gives every block a
//! negative count and its size in bytes), or with map keys out of order or a field skipped,
//! when a map of the decoded value may have dropped a key written twice. Only that last case
//! needs a second look at a producer's record (`Registry::whole`, with [`Plan::check`]).
//!
//! The plan decodes exactly what its schema says and fails, cheaply and without a message,
//! on anything else (a bad union index, a short read, invalid UTF-8, a block count larger
//! than the bytes left): the caller then takes the general path, which decodes the record or
//! names the problem. Only the built-in current schemas get a plan; none of them is
//! recursive, so the depth of what is decoded is bounded by the schema.

use std::collections::HashMap;
use std::fmt;

use apache_avro::Schema;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;

use crate::resolve::Names;

mod write;

/// How a body was written, from the most to the least like apache-avro's writer; a body is
/// the worst of what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Form {
    /// What apache-avro's writer writes for the decoded value.
    Canonical,
    /// Valid Avro another writer may write for the same value: a varint longer than it needs
    /// to be, an array or map in several blocks, a block with a negative count and its size.
    /// Every byte was read into the value.
    Valid,
    /// Map keys not in strictly increasing order (a Go map is written in random order), or a
    /// field the type has no place for skipped: a key written twice would be in the value
    /// once, so whether one was is for [`Plan::check`] to say.
    Unsure,
}

/// Why the fast path gave up; the general path says why in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fail;

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not decodable on the fast path")
    }
}

impl std::error::Error for Fail {}

impl de::Error for Fail {
    fn custom<T: fmt::Display>(_: T) -> Fail {
        Fail
    }
}

type Step<T> = Result<T, Fail>;

/// Index of a node in [`Plan::nodes`].
type NodeId = u32;

/// One schema node, references resolved to node indexes.
#[derive(Debug)]
enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Fixed(usize),
    /// Field names (borrowed from the schema, which lives for the process) in schema order.
    Record(Box<[(&'static str, NodeId)]>),
    Enum(Box<[&'static str]>),
    Array(NodeId),
    Map(NodeId),
    Union(Box<[NodeId]>),
}

/// A compiled schema: node 0 is the top-level record.
#[derive(Debug)]
pub(crate) struct Plan {
    nodes: Vec<Node>,
    /// A string node: what a map's keys are written as.
    string: NodeId,
}

impl Plan {
    /// The plan of `schema`, or `None` if it uses a type the fast path does not read
    /// (decimal, duration, uuid: none of ksched's schemas has one).
    pub(crate) fn compile(schema: &'static Schema, names: &Names<'static>) -> Option<Plan> {
        let mut compiler = Compiler {
            nodes: Vec::new(),
            named: HashMap::new(),
            names,
        };
        compiler.node(schema)?;
        let string = compiler.push(Node::String);
        Some(Plan {
            nodes: compiler.nodes,
            string,
        })
    }

    /// `T` decoded from all of `body`, and how `body` was written; `None` if the fast path
    /// cannot (see the module documentation) or bytes are left over.
    pub(crate) fn decode<T: DeserializeOwned>(&self, body: &[u8]) -> Option<(T, Form)> {
        let mut input = Input::new(body);
        let value = T::deserialize(self.value(&mut input, 0)).ok()?;
        input.buf.is_empty().then_some((value, input.form))
    }

    /// Reads all of `body` as one record, strictly, as [`Plan::decode`] does: `Err` if it is
    /// not one (cut short, bytes left over, anything the plan does not read); else the first
    /// key some map of it holds more than once, if any.
    pub(crate) fn check(&self, body: &[u8]) -> Result<Option<String>, Fail> {
        let mut input = Input::new(body);
        let mut twice = None;
        self.walk(&mut input, 0, Some(&mut twice))?;
        if !input.buf.is_empty() {
            return Err(Fail);
        }
        Ok(twice.map(str::to_owned))
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// A value of node `node`, to be read from `input`.
    fn value<'a, 'i>(&self, input: &'i mut Input<'a>, node: NodeId) -> Value<'a, 'i, '_> {
        Value {
            input,
            plan: self,
            node,
        }
    }

    /// Reads past one value of node `id`; what is skipped would not be encoded again.
    fn skip(&self, input: &mut Input<'_>, id: NodeId) -> Step<()> {
        input.note(Form::Unsure);
        self.walk(input, id, None)
    }

    /// Reads past one value of node `id`, noting in `twice` (when given) the first key a map
    /// holds more than once.
    fn walk<'a>(
        &self,
        input: &mut Input<'a>,
        id: NodeId,
        mut twice: Option<&mut Option<&'a str>>,
    ) -> Step<()> {
        match self.node(id) {
            Node::Null => {}
            Node::Boolean => {
                input.boolean()?;
            }
            Node::Int => {
                input.int()?;
            }
            Node::Long => {
                input.long()?;
            }
            Node::Float => {
                input.take(4)?;
            }
            Node::Double => {
                input.take(8)?;
            }
            Node::Bytes | Node::String => {
                input.bytes()?;
            }
            Node::Fixed(n) => {
                input.take(*n)?;
            }
            Node::Record(fields) => {
                for &(_, field) in fields {
                    self.walk(input, field, twice.as_deref_mut())?;
                }
            }
            Node::Enum(symbols) => {
                input.index(symbols)?;
            }
            Node::Array(item) => {
                let mut blocks = Blocks::default();
                while blocks.next_item(input)? {
                    self.walk(input, *item, twice.as_deref_mut())?;
                }
            }
            Node::Map(value) => {
                let mut blocks = Blocks::default();
                let mut keys = Vec::new();
                while blocks.next_item(input)? {
                    let key = input.str()?;
                    if twice.is_some() {
                        keys.push(key);
                    }
                    self.walk(input, *value, twice.as_deref_mut())?;
                }
                if let Some(twice) = twice
                    && twice.is_none()
                {
                    keys.sort_unstable();
                    *twice = keys.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
                }
            }
            Node::Union(branches) => {
                let branch = *input.index(branches)?;
                self.walk(input, branch, twice)?;
            }
        }
        Ok(())
    }
}

struct Compiler<'n> {
    nodes: Vec<Node>,
    /// Named types already compiled, by full name: a later reference points at them.
    named: HashMap<String, NodeId>,
    names: &'n Names<'static>,
}

impl Compiler<'_> {
    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    fn node(&mut self, schema: &'static Schema) -> Option<NodeId> {
        let node = match schema {
            Schema::Null => Node::Null,
            Schema::Boolean => Node::Boolean,
            Schema::Int | Schema::Date | Schema::TimeMillis => Node::Int,
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => Node::Long,
            Schema::Float => Node::Float,
            Schema::Double => Node::Double,
            Schema::Bytes => Node::Bytes,
            Schema::String => Node::String,
            Schema::Ref { name } => {
                if let Some(&id) = self.named.get(&name.fullname(None)) {
                    return Some(id);
                }
                let target = self.names.deref(schema).ok()?;
                return self.node(target);
            }
            Schema::Record(record) => {
                // Reserved first, so that a reference inside the record finds it.
                let id = self.push(Node::Null);
                self.named.insert(record.name.fullname(None), id);
                let mut fields = Vec::with_capacity(record.fields.len());
                for field in &record.fields {
                    fields.push((field.name.as_str(), self.node(&field.schema)?));
                }
                self.nodes[id as usize] = Node::Record(fields.into());
                return Some(id);
            }
            Schema::Enum(e) => {
                let id = self.push(Node::Enum(e.symbols.iter().map(String::as_str).collect()));
                self.named.insert(e.name.fullname(None), id);
                return Some(id);
            }
            Schema::Fixed(f) => {
                let id = self.push(Node::Fixed(f.size));
                self.named.insert(f.name.fullname(None), id);
                return Some(id);
            }
            Schema::Array(a) => Node::Array(self.node(&a.items)?),
            Schema::Map(m) => Node::Map(self.node(&m.types)?),
            Schema::Union(u) => {
                let mut branches = Vec::with_capacity(u.variants().len());
                for branch in u.variants() {
                    branches.push(self.node(branch)?);
                }
                Node::Union(branches.into())
            }
            Schema::Decimal(_) | Schema::BigDecimal | Schema::Uuid(_) | Schema::Duration(_) => {
                return None;
            }
        };
        Some(self.push(node))
    }
}

/// What is left of the body.
struct Input<'a> {
    buf: &'a [u8],
    /// How what was read so far was written.
    form: Form,
}

impl<'a> Input<'a> {
    fn new(buf: &'a [u8]) -> Input<'a> {
        Input {
            buf,
            form: Form::Canonical,
        }
    }

    /// Notes that something read was written in `form`.
    fn note(&mut self, form: Form) {
        self.form = self.form.max(form);
    }

    fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        if n > self.buf.len() {
            return Err(Fail);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Step<u8> {
        let (&b, rest) = self.buf.split_first().ok_or(Fail)?;
        self.buf = rest;
        Ok(b)
    }

    fn boolean(&mut self) -> Step<bool> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Fail),
        }
    }

    /// A zig-zag varint of at most 64 bits. One ending in a zero byte (after others) is
    /// longer than it needs to be: valid, not canonical.
    fn long(&mut self) -> Step<i64> {
        let mut n: u64 = 0;
        let mut shift = 0;
        loop {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(Fail);
            }
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if b == 0 && shift > 0 {
                    self.note(Form::Valid);
                }
                break;
            }
            shift += 7;
        }
        Ok((n >> 1) as i64 ^ -((n & 1) as i64))
    }

    fn int(&mut self) -> Step<i32> {
        i32::try_from(self.long()?).map_err(|_| Fail)
    }

    /// A length prefix, no more than the bytes left.
    fn bytes(&mut self) -> Step<&'a [u8]> {
        let n = usize::try_from(self.long()?).map_err(|_| Fail)?;
        self.take(n)
    }

    fn str(&mut self) -> Step<&'a str> {
        std::str::from_utf8(self.bytes()?).map_err(|_| Fail)
    }

    /// The item count of the next block of an array or map (0 at the end), and, when the
    /// writer gave the block's size, how many bytes are left once the block is read. A
    /// negative count is followed by that size in bytes (valid, not canonical; the block's
    /// items must fill it exactly). A count larger than the bytes left is refused even where
    /// items could take no bytes, so a corrupt count cannot make a loop of billions of steps.
    fn block(&mut self) -> Step<(usize, Option<usize>)> {
        let mut n = self.long()?;
        let mut end = None;
        if n < 0 {
            let size = usize::try_from(self.long()?).map_err(|_| Fail)?;
            end = Some(self.buf.len().checked_sub(size).ok_or(Fail)?);
            self.note(Form::Valid);
            n = n.checked_neg().ok_or(Fail)?;
        }
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.buf.len())
            .ok_or(Fail)?;
        Ok((n, end))
    }

    /// An index into `items` (a union's branch, an enum's symbol).
    fn index<'t, T>(&mut self, items: &'t [T]) -> Step<&'t T> {
        let i = usize::try_from(self.long()?).map_err(|_| Fail)?;
        items.get(i).ok_or(Fail)
    }
}

/// One value of node `node`, to be read from `input`.
struct Value<'a, 'i, 'p> {
    input: &'i mut Input<'a>,
    plan: &'p Plan,
    node: NodeId,
}

impl<'a, 'i, 'p> Value<'a, 'i, 'p> {
    fn at(self, node: NodeId) -> Value<'a, 'i, 'p> {
        Value { node, ..self }
    }
}

impl<'a> de::Deserializer<'a> for Value<'a, '_, '_> {
    type Error = Fail;

    fn deserialize_any<V: Visitor<'a>>(self, visitor: V) -> Step<V::Value> {
        let plan = self.plan;
        match plan.node(self.node) {
            Node::Null => visitor.visit_unit(),
            Node::Boolean => visitor.visit_bool(self.input.boolean()?),
            Node::Int => visitor.visit_i32(self.input.int()?),
            Node::Long => visitor.visit_i64(self.input.long()?),
            Node::Float => {
                let b = self.input.take(4)?;
                visitor.visit_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            Node::Double => {
                let mut b = [0; 8];
                b.copy_from_slice(self.input.take(8)?);
                visitor.visit_f64(f64::from_le_bytes(b))
            }
            Node::Bytes => visitor.visit_borrowed_bytes(self.input.bytes()?),
            Node::String => visitor.visit_borrowed_str(self.input.str()?),
            Node::Fixed(n) => visitor.visit_borrowed_bytes(self.input.take(*n)?),
            Node::Record(fields) => visitor.visit_map(Fields {
                input: self.input,
                plan,
                fields: fields.iter(),
                value: 0,
            }),
            Node::Enum(symbols) => visitor.visit_borrowed_str(self.input.index(symbols)?),
            Node::Array(item) => visitor.visit_seq(Items {
                input: self.input,
                plan,
                item: *item,
                blocks: Blocks::default(),
            }),
            Node::Map(value) => visitor.visit_map(Entries {
                input: self.input,
                plan,
                value: *value,
                blocks: Blocks::default(),
                last: None,
            }),
            Node::Union(branches) => {
                let branch = *self.input.index(branches)?;
                self.at(branch).deserialize_any(visitor)
            }
        }
    }

    /// `["null", T]` (either order) is an `Option<T>`.
    fn deserialize_option<V: Visitor<'a>>(self, visitor: V) -> Step<V::Value> {
        let plan = self.plan;
        match plan.node(self.node) {
            Node::Union(branches) => {
                let branch = *self.input.index(branches)?;
                match plan.node(branch) {
                    Node::Null => visitor.visit_none(),
                    _ => visitor.visit_some(self.at(branch)),
                }
            }
            Node::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    /// An Avro enum is a Rust enum of unit variants named by its symbols; a union of records
    /// is a Rust enum whose variant index is the branch index (as apache-avro writes it).
    fn deserialize_enum<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Step<V::Value> {
        let plan = self.plan;
        match plan.node(self.node) {
            Node::Enum(symbols) => visitor.visit_enum(
                de::value::BorrowedStrDeserializer::<Fail>::new(self.input.index(symbols)?),
            ),
            Node::Union(branches) => {
                let index = self.input.long()?;
                let branch = usize::try_from(index)
                    .ok()
                    .and_then(|i| branches.get(i))
                    .copied()
                    .ok_or(Fail)?;
                visitor.visit_enum(Branch {
                    index: u32::try_from(index).map_err(|_| Fail)?,
                    value: self.at(branch),
                })
            }
            _ => Err(Fail),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Step<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'a>>(self, visitor: V) -> Step<V::Value> {
        self.plan.skip(self.input, self.node)?;
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        <W: Visitor<'a>>
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

/// A record's fields, in schema order, as a map from field name to value.
struct Fields<'a, 'i, 'p> {
    input: &'i mut Input<'a>,
    plan: &'p Plan,
    fields: std::slice::Iter<'p, (&'static str, NodeId)>,
    /// The node of the field whose name was handed out last.
    value: NodeId,
}

impl<'a> de::MapAccess<'a> for Fields<'a, '_, '_> {
    type Error = Fail;

    fn next_key_seed<K: DeserializeSeed<'a>>(&mut self, seed: K) -> Step<Option<K::Value>> {
        let Some(&(name, node)) = self.fields.next() else {
            return Ok(None);
        };
        self.value = node;
        seed.deserialize(de::value::BorrowedStrDeserializer::new(name))
            .map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'a>>(&mut self, seed: S) -> Step<S::Value> {
        seed.deserialize(self.plan.value(self.input, self.value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

/// An array's items, block by block.
struct Items<'a, 'i, 'p> {
    input: &'i mut Input<'a>,
    plan: &'p Plan,
    item: NodeId,
    blocks: Blocks,
}

/// Where an array or a map is in its blocks.
#[derive(Debug, Default)]
struct Blocks {
    /// Items left in the current block.
    left: usize,
    /// Non-empty blocks read: more than one is valid, not canonical.
    read: u32,
    /// The empty block that ends the array or map was read.
    ended: bool,
    /// Where the current block ends (bytes left after it), if its writer gave its size.
    end: Option<usize>,
}

impl Blocks {
    /// Whether another item follows (reading the next block's count when the current one
    /// is used up); it is then counted as read.
    fn next_item(&mut self, input: &mut Input<'_>) -> Step<bool> {
        if self.left == 0 {
            // A block that came with its size ends exactly there: a size that lies is not
            // valid Avro (a reader skipping by it would read something else).
            if self.end.take().is_some_and(|end| end != input.buf.len()) {
                return Err(Fail);
            }
            if self.ended {
                return Ok(false);
            }
            (self.left, self.end) = input.block()?;
            if self.left == 0 {
                self.ended = true;
                return Ok(false);
            }
            self.read += 1;
            if self.read > 1 {
                input.note(Form::Valid);
            }
        }
        self.left -= 1;
        Ok(true)
    }
}

impl<'a> de::SeqAccess<'a> for Items<'a, '_, '_> {
    type Error = Fail;

    fn next_element_seed<S: DeserializeSeed<'a>>(&mut self, seed: S) -> Step<Option<S::Value>> {
        if !self.blocks.next_item(self.input)? {
            return Ok(None);
        }
        seed.deserialize(self.plan.value(self.input, self.item))
            .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.blocks.left)
    }
}

/// A map's entries (string keys), block by block.
struct Entries<'a, 'i, 'p> {
    input: &'i mut Input<'a>,
    plan: &'p Plan,
    value: NodeId,
    blocks: Blocks,
    /// The last key read: keys in strictly increasing order are what encoding a `BTreeMap`
    /// gives; any other order may hide a key written twice, which the decoded map would hold
    /// once.
    last: Option<&'a str>,
}

impl<'a> de::MapAccess<'a> for Entries<'a, '_, '_> {
    type Error = Fail;

    fn next_key_seed<K: DeserializeSeed<'a>>(&mut self, seed: K) -> Step<Option<K::Value>> {
        if !self.blocks.next_item(self.input)? {
            return Ok(None);
        }
        let key = self.input.str()?;
        if self.last.is_some_and(|last| last >= key) {
            self.input.note(Form::Unsure);
        }
        self.last = Some(key);
        seed.deserialize(de::value::BorrowedStrDeserializer::new(key))
            .map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'a>>(&mut self, seed: S) -> Step<S::Value> {
        seed.deserialize(self.plan.value(self.input, self.value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.blocks.left)
    }
}

/// The branch of a union read as an enum variant: its index names the variant.
struct Branch<'a, 'i, 'p> {
    index: u32,
    value: Value<'a, 'i, 'p>,
}

impl<'a, 'i, 'p> de::EnumAccess<'a> for Branch<'a, 'i, 'p> {
    type Error = Fail;
    type Variant = Value<'a, 'i, 'p>;

    fn variant_seed<S: DeserializeSeed<'a>>(self, seed: S) -> Step<(S::Value, Self::Variant)> {
        let variant = seed.deserialize(IntoDeserializer::<Fail>::into_deserializer(self.index))?;
        Ok((variant, self.value))
    }
}

impl<'a> de::VariantAccess<'a> for Value<'a, '_, '_> {
    type Error = Fail;

    fn unit_variant(self) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Null => Ok(()),
            _ => Err(Fail),
        }
    }

    fn newtype_variant_seed<S: DeserializeSeed<'a>>(self, seed: S) -> Step<S::Value> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'a>>(self, _len: usize, visitor: V) -> Step<V::Value> {
        de::Deserializer::deserialize_any(self, visitor)
    }

    fn struct_variant<V: Visitor<'a>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Step<V::Value> {
        de::Deserializer::deserialize_any(self, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(bytes: &[u8]) -> Input<'_> {
        Input::new(bytes)
    }

    /// The zig-zag varint of `n`.
    fn varint(n: i64) -> Vec<u8> {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
        out
    }

    /// A plan of `json`, which lives for the test process.
    fn plan(json: &str) -> Plan {
        let schema: &'static Schema = Box::leak(Box::new(Schema::parse_str(json).unwrap()));
        let names: &'static Names<'static> = Box::leak(Box::new(Names::of(schema)));
        Plan::compile(schema, names).expect("a plan")
    }

    #[test]
    fn fields_the_type_does_not_have_are_skipped_whatever_their_schema() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct Last {
            last: String,
        }
        let plan = plan(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "f", "type": "float"},
                {"name": "d", "type": "double"},
                {"name": "b", "type": "boolean"},
                {"name": "x", "type": {"type": "fixed", "name": "X", "size": 3}},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
                {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "E"}}},
                {"name": "u", "type": ["null", "X", "string"]},
                {"name": "last", "type": "string"}
            ]}"#,
        );
        let mut body = vec![0; 4 + 8];
        body.push(1);
        body.extend(b"xyz");
        body.push(varint(1)[0]);
        // {"k": [A, B]}: one block of one entry, an array of one block of two.
        body.extend([
            varint(1)[0],
            varint(1)[0],
            b'k',
            varint(2)[0],
            0,
            varint(1)[0],
            0,
            0,
        ]);
        body.extend([varint(2)[0], varint(2)[0], b'h', b'i']);
        body.extend([varint(4)[0], b'l', b'a', b's', b't']);
        let (value, form) = plan.decode::<Last>(&body).expect("decodes");
        assert_eq!(
            value,
            Last {
                last: "last".into()
            }
        );
        assert_eq!(form, Form::Unsure, "a skipped map may hold a key twice");
        assert_eq!(plan.check(&body), Ok(None), "the body is one record");
        // One byte short, one byte over, a union index past its branches.
        assert!(plan.decode::<Last>(&body[..body.len() - 1]).is_none());
        let mut over = body.clone();
        over.push(0);
        assert!(plan.decode::<Last>(&over).is_none());
        let at = body.len() - 9;
        assert_eq!(body[at], varint(2)[0], "the union's index");
        body[at] = varint(3)[0];
        assert!(plan.decode::<Last>(&body).is_none());
    }

    #[test]
    fn every_current_schema_has_a_plan() {
        for name in crate::TOP_LEVEL {
            let entry = crate::registry().current(name).unwrap();
            assert!(entry.plan.is_some(), "{name} has no fast plan");
        }
    }

    #[test]
    fn longs_are_zig_zag_varints_of_at_most_ten_bytes() {
        assert_eq!(input(&[0x00]).long(), Ok(0));
        assert_eq!(input(&[0x01]).long(), Ok(-1));
        assert_eq!(input(&[0x02]).long(), Ok(1));
        assert_eq!(input(&[0x80, 0x01]).long(), Ok(64));
        let max = [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(input(&max).long(), Ok(i64::MAX));
        let min = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(input(&min).long(), Ok(i64::MIN));
        // A tenth byte with more than the 64th bit, an eleventh byte, a varint cut short.
        let over = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(input(&over).long(), Err(Fail));
        let long = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x81, 0x00,
        ];
        assert_eq!(input(&long).long(), Err(Fail));
        assert_eq!(input(&[0x80]).long(), Err(Fail));
        assert_eq!(input(&[0x80, 0x80, 0x80, 0x80, 0x10]).int(), Err(Fail));
        for n in [
            0,
            1,
            -1,
            63,
            -64,
            64,
            -65,
            1 << 40,
            i32::MAX.into(),
            i32::MIN.into(),
        ] {
            assert_eq!(input(&varint(n)).long(), Ok(n), "{n}");
        }
        assert_eq!(input(&varint(i64::MAX)).long(), Ok(i64::MAX));
        assert_eq!(input(&varint(i64::MIN)).long(), Ok(i64::MIN));
    }

    #[test]
    fn a_length_or_block_count_past_the_end_fails_without_reading() {
        // 5 bytes claimed, 3 left.
        assert_eq!(input(&[0x0a, b'a', b'b', b'c']).bytes(), Err(Fail));
        assert_eq!(input(&[0x01]).bytes(), Err(Fail), "negative length");
        // A block of a billion items with 2 bytes left.
        let mut billion = varint(1_000_000_000);
        billion.extend([0, 0]);
        assert_eq!(input(&billion).block(), Err(Fail));
        assert_eq!(input(&billion).long(), Ok(1_000_000_000));
        // A negative count carries the block's size in bytes: no more than is left.
        assert_eq!(input(&[0x03, 0x04, 0, 0]).block(), Ok((2, Some(0))));
        assert_eq!(input(&[0x03, 0x06, 0, 0]).block(), Err(Fail));
        assert_eq!(input(&[0x04, 0xff, 0xfe]).str(), Err(Fail), "not UTF-8");
        assert_eq!(input(&[0x04, b'o', b'k']).str(), Ok("ok"));
    }

    #[test]
    fn what_another_encoder_writes_is_valid_and_keys_out_of_order_unsure() {
        let form = |bytes: &[u8], read: fn(&mut Input<'_>) -> Step<()>| {
            let mut i = input(bytes);
            read(&mut i).unwrap();
            assert!(i.buf.is_empty(), "{bytes:02x?} read whole");
            i.form
        };
        let long: fn(&mut Input<'_>) -> Step<()> = |i| i.long().map(drop);
        assert_eq!(form(&[0x00], long), Form::Canonical);
        assert_eq!(form(&[0x80, 0x01], long), Form::Canonical);
        assert_eq!(form(&[0x80, 0x00], long), Form::Valid, "0 in two bytes");
        assert_eq!(form(&[0x82, 0x80, 0x00], long), Form::Valid, "1 in three");
        // Blocks: one non-empty block then the end; an empty array; two blocks; a negative
        // count with its size.
        let blocks: fn(&mut Input<'_>) -> Step<()> = |i| {
            let mut b = Blocks::default();
            while b.next_item(i)? {}
            Ok(())
        };
        assert_eq!(form(&[0x02, 0x00], blocks), Form::Canonical);
        assert_eq!(form(&[0x00], blocks), Form::Canonical);
        assert_eq!(form(&[0x02, 0x02, 0x00], blocks), Form::Valid);
        assert_eq!(form(&[0x01, 0x00, 0x00], blocks), Form::Valid);
        // These items take no bytes: a block that claims one is not filled by them.
        let mut lying = input(&[0x01, 0x02, 0x00]);
        assert_eq!(blocks(&mut lying), Err(Fail));
        // Map keys: in order; out of order; twice.
        #[derive(Debug, serde::Deserialize)]
        struct M {
            #[allow(dead_code)]
            m: std::collections::BTreeMap<String, i64>,
        }
        let plan = plan(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "m", "type": {"type": "map", "values": "long"}}
            ]}"#,
        );
        let map = |keys: &[u8]| {
            let mut body = varint(keys.len() as i64);
            for &k in keys {
                body.extend([varint(1)[0], k, varint(7)[0]]);
            }
            body.push(0);
            body
        };
        let decoded = |body: &[u8]| plan.decode::<M>(body).map(|(m, f)| (m.m.len(), f));
        assert_eq!(decoded(&map(b"ab")), Some((2, Form::Canonical)));
        assert_eq!(decoded(&map(b"ba")), Some((2, Form::Unsure)));
        assert_eq!(decoded(&map(b"aba")), Some((2, Form::Unsure)));
        assert_eq!(plan.check(&map(b"ba")), Ok(None));
        assert_eq!(plan.check(&map(b"bab")), Ok(Some("b".to_owned())));
        // The same in a negative-count block, as hamba/avro writes it: valid, then unsure.
        let blocked = |keys: &[u8]| {
            let mut body = varint(-(keys.len() as i64));
            body.extend(varint(3 * keys.len() as i64));
            for &k in keys {
                body.extend([varint(1)[0], k, varint(7)[0]]);
            }
            body.push(0);
            body
        };
        assert_eq!(decoded(&blocked(b"ab")), Some((2, Form::Valid)));
        assert_eq!(decoded(&blocked(b"ba")), Some((2, Form::Unsure)));
        assert_eq!(plan.check(&blocked(b"aa")), Ok(Some("a".to_owned())));
        // A block size one byte short or over: not valid, whichever way it is read.
        for wrong in [5, 7] {
            let mut body = blocked(b"ab");
            assert_eq!(body[1], varint(6)[0], "the block's size");
            body[1] = varint(wrong)[0];
            assert_eq!(decoded(&body), None, "size {wrong}");
            assert_eq!(plan.check(&body), Err(Fail), "size {wrong}");
        }
        // Cut short or with a byte over: not one record.
        let whole = map(b"ab");
        assert_eq!(plan.check(&whole[..whole.len() - 1]), Err(Fail));
        let mut over = whole.clone();
        over.push(0);
        assert_eq!(plan.check(&over), Err(Fail));
    }
}
