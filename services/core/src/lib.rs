//! ksched's pure decision core.
//!
//! Everything that decides lives here and nothing here does I/O, reads a clock or draws a
//! random number: `decide(state, input, now)` returns events, `apply(state, event)` is the only
//! way state changes. Recovery, audit replay and the live processor all use the same two
//! functions, which is what makes the journal a complete explanation of every decision.

pub mod events;
pub mod records;
