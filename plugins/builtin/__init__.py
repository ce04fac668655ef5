"""The plugins shipped with the service: each module exposes `plugin`, a `plugins.sdk.Plugin`.

They are loaded like any third party's (listed in `settings.PLUGINS_BUILTIN`) and use only the
SDK's contract, so they double as worked examples for plugin authors.
"""
