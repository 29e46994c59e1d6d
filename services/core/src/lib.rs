//! ksched's pure decision core.
//!
//! Everything that decides lives here and nothing here does I/O, reads a clock or draws a
//! random number: [`decide::process`] turns an input into events, [`apply::apply`] is the only
//! way state changes. Recovery, audit replay and the live processor all use the same two
//! functions, which is what makes the journal a complete explanation of every decision.

pub mod apply;
pub mod decide;
pub mod describe;
pub mod events;
pub mod hash;
pub mod outputs;
pub mod policy;
pub mod properties;
pub mod reason;
pub mod records;
pub mod rules;
pub mod state;
pub mod strategy;

pub use apply::{apply, apply_entry};
pub use decide::{Ctx, Processed, process};
pub use state::State;
