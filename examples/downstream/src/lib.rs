//! Nothing here: the tests are what this example is for.
