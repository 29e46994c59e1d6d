//! The fast path's writer: a serde serializer driven by the same compiled plan, writing the
//! Avro binary encoding straight into the output.
//!
//! apache-avro's schema-aware serializer, which this replaces for the current schemas, looks
//! every record field and union branch up by name as it writes: about a quarter of the
//! deciding thread's time went to encoding journal entries and dispatches (measured with
//! `perf`). Here the fields are walked in schema order and checked against the names
//! serde gives, unions are chosen by branch index as the reader reads them, and nothing else is
//! looked up.
//!
//! It writes what apache-avro writes, byte for byte: each array and map in one block (the
//! count, the items, then a zero count), integers as zig-zag varints. Anything it does not
//! expect (a field out of schema order or skipped, a sequence of unknown length, a value of
//! another type than its schema node) fails, cheaply and without a message, and the caller
//! then writes with apache-avro, which writes it or names the problem. Debug builds check
//! every fast write against apache-avro's.

use serde::Serialize;
use serde::ser::{self, Impossible};

use super::{Fail, Node, NodeId, Plan, Step};

impl ser::Error for Fail {
    fn custom<T: std::fmt::Display>(_: T) -> Fail {
        Fail
    }
}

impl Plan {
    /// Appends the encoding of `value` to `out`; `None` (and `out` as it was) if the fast
    /// path cannot write it (see the module documentation).
    pub(crate) fn encode<T: Serialize + ?Sized>(&self, value: &T, out: &mut Vec<u8>) -> Option<()> {
        let start = out.len();
        let written = value.serialize(Writer {
            plan: self,
            node: 0,
            out,
        });
        if written.is_err() {
            out.truncate(start);
        }
        written.ok()
    }
}

/// Appends `n` as a zig-zag varint (Avro's `int` and `long`).
fn long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// A value of node `node`, to be written to `out`.
struct Writer<'p, 'o> {
    plan: &'p Plan,
    node: NodeId,
    out: &'o mut Vec<u8>,
}

impl<'p, 'o> Writer<'p, 'o> {
    fn at(self, node: NodeId) -> Writer<'p, 'o> {
        Writer { node, ..self }
    }

    fn integer(self, n: i64) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Int if i32::try_from(n).is_ok() => long(self.out, n),
            Node::Long => long(self.out, n),
            _ => return Err(Fail),
        }
        Ok(())
    }

    /// The index of the union branch `pick` chooses.
    fn branch(&self, pick: impl Fn(&Node) -> bool) -> Step<(usize, NodeId)> {
        let Node::Union(branches) = self.plan.node(self.node) else {
            return Err(Fail);
        };
        let mut chosen = branches
            .iter()
            .enumerate()
            .filter(|(_, b)| pick(self.plan.node(**b)));
        match (chosen.next(), chosen.next()) {
            (Some((i, &b)), None) => Ok((i, b)),
            _ => Err(Fail),
        }
    }

    /// The count that opens an array's or a map's only block (none when empty).
    fn open_block(self, len: Option<usize>, node: NodeId) -> Step<Block<'p, 'o>> {
        let len = len.ok_or(Fail)?;
        if len > 0 {
            long(self.out, i64::try_from(len).map_err(|_| Fail)?);
        }
        Ok(Block {
            plan: self.plan,
            item: node,
            out: self.out,
            left: len,
        })
    }
}

impl<'p, 'o> ser::Serializer for Writer<'p, 'o> {
    type Ok = ();
    type Error = Fail;
    type SerializeSeq = Block<'p, 'o>;
    type SerializeTuple = Impossible<(), Fail>;
    type SerializeTupleStruct = Impossible<(), Fail>;
    type SerializeTupleVariant = Impossible<(), Fail>;
    type SerializeMap = Block<'p, 'o>;
    type SerializeStruct = Fields<'p, 'o>;
    type SerializeStructVariant = Impossible<(), Fail>;

    /// As apache-avro's writer says by default: a type with a compact form writes that one.
    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_bool(self, v: bool) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Boolean => {
                self.out.push(u8::from(v));
                Ok(())
            }
            _ => Err(Fail),
        }
    }

    fn serialize_i8(self, v: i8) -> Step<()> {
        self.integer(i64::from(v))
    }

    fn serialize_i16(self, v: i16) -> Step<()> {
        self.integer(i64::from(v))
    }

    fn serialize_i32(self, v: i32) -> Step<()> {
        self.integer(i64::from(v))
    }

    fn serialize_i64(self, v: i64) -> Step<()> {
        self.integer(v)
    }

    fn serialize_u8(self, v: u8) -> Step<()> {
        self.integer(i64::from(v))
    }

    fn serialize_u16(self, v: u16) -> Step<()> {
        self.integer(i64::from(v))
    }

    fn serialize_u32(self, v: u32) -> Step<()> {
        self.integer(i64::from(v))
    }

    fn serialize_u64(self, v: u64) -> Step<()> {
        self.integer(i64::try_from(v).map_err(|_| Fail)?)
    }

    fn serialize_f32(self, v: f32) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Float => {
                self.out.extend_from_slice(&v.to_le_bytes());
                Ok(())
            }
            _ => Err(Fail),
        }
    }

    fn serialize_f64(self, v: f64) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Double => {
                self.out.extend_from_slice(&v.to_le_bytes());
                Ok(())
            }
            _ => Err(Fail),
        }
    }

    fn serialize_char(self, _: char) -> Step<()> {
        Err(Fail)
    }

    fn serialize_str(self, v: &str) -> Step<()> {
        match self.plan.node(self.node) {
            Node::String => {
                long(self.out, i64::try_from(v.len()).map_err(|_| Fail)?);
                self.out.extend_from_slice(v.as_bytes());
            }
            // A Rust string may hold an Avro enum's symbol (the reader gives it as one).
            Node::Enum(symbols) => {
                let i = symbols.iter().position(|s| *s == v).ok_or(Fail)?;
                long(self.out, i as i64);
            }
            _ => return Err(Fail),
        }
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Bytes => long(self.out, i64::try_from(v.len()).map_err(|_| Fail)?),
            Node::Fixed(n) if *n == v.len() => {}
            _ => return Err(Fail),
        }
        self.out.extend_from_slice(v);
        Ok(())
    }

    /// `["null", T]` (either order) is an `Option<T>`, as the reader reads it.
    fn serialize_none(self) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Null => Ok(()),
            Node::Union(_) => {
                let (i, _) = self.branch(|b| matches!(b, Node::Null))?;
                long(self.out, i as i64);
                Ok(())
            }
            _ => Err(Fail),
        }
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Null => Err(Fail),
            Node::Union(_) => {
                let (i, b) = self.branch(|b| !matches!(b, Node::Null))?;
                long(self.out, i as i64);
                value.serialize(self.at(b))
            }
            _ => value.serialize(self),
        }
    }

    fn serialize_unit(self) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Null => Ok(()),
            _ => Err(Fail),
        }
    }

    fn serialize_unit_struct(self, _: &'static str) -> Step<()> {
        self.serialize_unit()
    }

    /// A Rust enum of unit variants is an Avro enum, named by its symbols.
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Step<()> {
        match self.plan.node(self.node) {
            Node::Enum(_) => self.serialize_str(variant),
            _ => Err(Fail),
        }
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Step<()> {
        value.serialize(self)
    }

    /// A Rust enum of newtype variants is a union whose branch index is the variant's index
    /// (as apache-avro writes it and the reader reads it).
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        value: &T,
    ) -> Step<()> {
        let Node::Union(branches) = self.plan.node(self.node) else {
            return Err(Fail);
        };
        let branch = *branches.get(index as usize).ok_or(Fail)?;
        long(self.out, i64::from(index));
        value.serialize(self.at(branch))
    }

    fn serialize_seq(self, len: Option<usize>) -> Step<Block<'p, 'o>> {
        match self.plan.node(self.node) {
            Node::Array(item) => {
                let item = *item;
                self.open_block(len, item)
            }
            _ => Err(Fail),
        }
    }

    fn serialize_tuple(self, _: usize) -> Step<Impossible<(), Fail>> {
        Err(Fail)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Step<Impossible<(), Fail>> {
        Err(Fail)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Step<Impossible<(), Fail>> {
        Err(Fail)
    }

    fn serialize_map(self, len: Option<usize>) -> Step<Block<'p, 'o>> {
        match self.plan.node(self.node) {
            Node::Map(value) => {
                let value = *value;
                self.open_block(len, value)
            }
            _ => Err(Fail),
        }
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Step<Fields<'p, 'o>> {
        match self.plan.node(self.node) {
            Node::Record(fields) => Ok(Fields {
                plan: self.plan,
                fields: fields.iter(),
                out: self.out,
            }),
            _ => Err(Fail),
        }
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Step<Impossible<(), Fail>> {
        Err(Fail)
    }
}

/// An array's or a map's items, in one block of the count given at its start.
struct Block<'p, 'o> {
    plan: &'p Plan,
    /// The node of the items (of the values, for a map).
    item: NodeId,
    out: &'o mut Vec<u8>,
    left: usize,
}

impl Block<'_, '_> {
    fn item<T: Serialize + ?Sized>(&mut self, node: NodeId, value: &T) -> Step<()> {
        value.serialize(Writer {
            plan: self.plan,
            node,
            out: self.out,
        })
    }

    /// The zero count that ends the array or map, once every item counted is written.
    fn close(self) -> Step<()> {
        if self.left != 0 {
            return Err(Fail);
        }
        self.out.push(0);
        Ok(())
    }
}

impl ser::SerializeSeq for Block<'_, '_> {
    type Ok = ();
    type Error = Fail;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Step<()> {
        self.left = self.left.checked_sub(1).ok_or(Fail)?;
        self.item(self.item, value)
    }

    fn end(self) -> Step<()> {
        self.close()
    }
}

impl ser::SerializeMap for Block<'_, '_> {
    type Ok = ();
    type Error = Fail;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Step<()> {
        self.left = self.left.checked_sub(1).ok_or(Fail)?;
        self.item(self.plan.string, key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Step<()> {
        self.item(self.item, value)
    }

    fn end(self) -> Step<()> {
        self.close()
    }
}

/// A record's fields, in schema order.
struct Fields<'p, 'o> {
    plan: &'p Plan,
    fields: std::slice::Iter<'p, (&'static str, NodeId)>,
    out: &'o mut Vec<u8>,
}

impl ser::SerializeStruct for Fields<'_, '_> {
    type Ok = ();
    type Error = Fail;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Step<()> {
        match self.fields.next() {
            Some(&(name, node)) if name == key => value.serialize(Writer {
                plan: self.plan,
                node,
                out: self.out,
            }),
            _ => Err(Fail),
        }
    }

    fn skip_field(&mut self, _: &'static str) -> Step<()> {
        Err(Fail)
    }

    fn end(self) -> Step<()> {
        if self.fields.len() == 0 {
            Ok(())
        } else {
            Err(Fail)
        }
    }
}
