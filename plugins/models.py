"""What staff configure about plugins and MCP servers, and what users switch per conversation.

The plugins themselves live in code (the registry, `plugins.registry`); these rows hold only
what the service decides about them: whether a plugin is on, for which plans, its settings
(secrets encrypted, `plugins.crypto`), the MCP servers staff registered and the tools they
last listed, and each conversation's tool switches.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from chatsite.netpolicy import AddressPolicy

# The networks MCP servers may be on besides public addresses (chatsite/netpolicy.py).
MCP_NETWORKS_SETTING = "PLUGINS_MCP_ALLOWED_NETWORKS"


class PluginConfig(models.Model):
    """Staff settings of one discovered plugin, by its slug.

    `values` holds the plain settings; `secrets` holds the secret ones as one Fernet token
    (a JSON object inside), so a database dump shows no secret. A plugin without a row keeps
    its defaults (`plugins.selectors.plugin_defaults`).
    """

    slug = models.SlugField(max_length=64, unique=True)
    enabled = models.BooleanField(default=False)
    all_plans = models.BooleanField(
        default=True, help_text="Available on every plan; otherwise only on the plans listed."
    )
    plans = models.ManyToManyField("billing.Plan", blank=True, related_name="+")
    values = models.JSONField(default=dict, blank=True)
    secrets = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        verbose_name = "plugin"

    def __str__(self) -> str:
        return self.slug


class McpServer(models.Model):
    """A remote MCP server (streamable HTTP) whose tools the model may call.

    Its tools are listed by staff ("refresh tools") and stored in `tools`; the model sees them
    as `<slug>__<tool>`. `secret_headers` (a token and extra HTTP headers) is encrypted.
    `url` must lead to a public address, or to one of `PLUGINS_MCP_ALLOWED_NETWORKS`: checked
    when staff save it (`clean`) and on every connection (`plugins.mcp_client`).
    """

    slug = models.SlugField(
        max_length=32,
        unique=True,
        help_text="Prefix of its tools' names as the model sees them (<slug>__<tool>).",
    )
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500, help_text="The streamable HTTP endpoint, e.g. …/mcp")
    secret_headers = models.TextField(blank=True, editable=False)
    enabled = models.BooleanField(default=False)
    all_plans = models.BooleanField(
        default=True, help_text="Available on every plan; otherwise only on the plans listed."
    )
    plans = models.ManyToManyField("billing.Plan", blank=True, related_name="+")
    tools = models.JSONField(
        default=list, blank=True, help_text="As last listed: name, description, input_schema."
    )
    tools_refreshed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name or self.slug

    def clean(self) -> None:
        super().clean()
        refusal = AddressPolicy.from_setting(MCP_NETWORKS_SETTING).url_refusal(self.url)
        if refusal is not None:
            raise ValidationError({"url": refusal})


class ConversationTool(models.Model):
    """A user's switch of one tool in one conversation (no row: the tool is on)."""

    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="tool_switches"
    )
    tool_name = models.CharField(max_length=64)
    enabled = models.BooleanField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "tool_name"], name="plugins_conversation_tool_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {'on' if self.enabled else 'off'} in {self.conversation_id}"


class MessageEmbedding(models.Model):
    """The meaning of one message as a vector, for the `conversation_search` tool.

    One row per message and embedding model, owned by the message's author. The text itself
    is never copied here: the row dies with its message (and so with its conversation), and a
    search reads the snippet from the message, so nothing deleted stays searchable.
    """

    message = models.ForeignKey("conversations.Message", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="+"
    )
    model_name = models.CharField(max_length=100)
    # float32, little-endian, unit length: a dot product is the cosine similarity.
    vector = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["message", "model_name"], name="plugins_message_embedding_unique"
            )
        ]
        indexes = [models.Index(fields=["user", "model_name"], name="plugins_embedding_user_idx")]

    def __str__(self) -> str:
        return f"{self.model_name} embedding of {self.message_id}"
