module github.com/ofsdn/ofsdn

go 1.26

replace antrea.io/libOpenflow => github.com/antrea-io/libOpenflow v0.15.0
