"""What a chat template cannot do for agentrl: the errors the codec and the probe raise."""


class ChatTemplateError(ValueError):
    """The chat template cannot do what agentrl needs; the message names the problem and the fix."""


class NotAppendOnly(ChatTemplateError):
    """The template renders the history differently once more messages follow (reasoning dropped, an end token
    replaced): the ids generated so far are not a prefix of the whole conversation's ids."""
