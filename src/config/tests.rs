//! Table-driven tests: every key of every ConfigMap with its default, an accepted value and a
//! rejected one; the shipped manifests; and the annotation-over-ConfigMap merge.

mod annotations;
mod keys;
mod namespace_defaults;
