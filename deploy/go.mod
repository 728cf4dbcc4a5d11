module github.com/ration-dev/ration/deploy

go 1.26.7
