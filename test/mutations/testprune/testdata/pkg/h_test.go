package pkg_test

func fromH() {}
