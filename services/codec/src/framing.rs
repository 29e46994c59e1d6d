//! How a writer frames a record on a topic.

use std::collections::HashMap;

use crate::{Record, registry};

/// How a writer frames a record on a topic: the Confluent id (and union branch) of its type
/// there, or single-object encoding when there is none.
#[derive(Debug, Default)]
pub struct Framing {
    ids: HashMap<(String, &'static str), (u32, Option<u32>)>,
}

impl Framing {
    /// Writes records named `name` on `topic` in the Confluent wire format with schema `id`
    /// (and the union's `branch` when the id names a union).
    pub fn set_confluent(&mut self, topic: &str, name: &'static str, id: u32, branch: Option<u32>) {
        self.ids.insert((topic.to_owned(), name), (id, branch));
    }

    /// `value` encoded for `topic`.
    pub fn encode<T: Record>(&self, topic: &str, value: &T) -> crate::Result<Vec<u8>> {
        match self.ids.get(&(topic.to_owned(), T::NAME)) {
            Some(&(id, branch)) => {
                let mut buf = Vec::with_capacity(256);
                registry().encode_confluent_into(value, id, branch, &mut buf)?;
                Ok(buf)
            }
            None => registry().encode(value),
        }
    }

    /// Whether any topic is written in the Confluent wire format.
    pub fn is_confluent(&self) -> bool {
        !self.ids.is_empty()
    }
}
