//! Child names and the labels the data plane selects by (step 3 fills this in).
