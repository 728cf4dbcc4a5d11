package pkg_test

// Mentioned only by a declaration TestA does not reach, in a file it
// does (c_test.go): kept, and so is what it mentions.
func helper2() { fromH() }
