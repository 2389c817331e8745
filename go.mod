module sluice

go 1.26
