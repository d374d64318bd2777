module github.com/strata-llm/strata

go 1.26.0

require (
	github.com/ardanlabs/jinja v1.8.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
