module specmla

go 1.22
