# sam build: the API function's zip (template.yaml, ApiFunction, BuildMethod makefile).
build-ApiFunction:
	infra/build-api.sh "$(ARTIFACTS_DIR)"
